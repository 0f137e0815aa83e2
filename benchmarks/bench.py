"""The sampler's speed gate (``make bench``): decoding of both text demos, as a ratio against an in-repo reference in
the same run, checked against the floors stored in ``benchmarks/bench_floor.json``; exit status 1 when a ratio falls
below its floor.

    .venv/bin/python benchmarks/bench.py                 # both demos, ~1-2 min on 2 cores
    .venv/bin/python benchmarks/bench.py --write-floor   # store 0.7 x the measured ratios as the new floors

Per demo model (``llada-countdown``, full attention; ``sdar-countdown``, block 4), on the first ``--prompts`` held-out
Countdown puzzles at the demo's rollout length, greedy:

* **reference**: :func:`reference_decode`, a plain loop written here on purpose (it shares no code with the
  sampler): one prompt at a time, no cache, one token per forward pass (the most confident masked slot of the
  current block), every pass over the whole sequence. Its time is the model's forwards and little else, so the ratio
  moves when the sampler gets slower or faster, not when the machine does.
* **fast**: the library's sampler as rollouts use it (:func:`dllm_rl.sampling.generate_batched`: all the prompts in
  one batch, threshold 0.9, EOS stops, the demo's cache setting).

Runs interleave reference and fast (``--rounds`` each) and the medians of their CPU times are compared (one torch
thread, so the machine's other tenants do not count). ``DLLM_RL_BENCH_SLOW_S`` spins that many CPU seconds in every
fast run (this script only), which shows the gate failing without touching the library. The gate's logic is tested
without timing in ``tests/scale/test_bench_gate.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import dllm_rl

DEMO = Path(dllm_rl.__file__).parent / "assets" / "demo"
FLOOR = Path(__file__).with_name("bench_floor.json")
#: demo model -> (generation length, decoding block of the full-attention model, cache): the demo configs' rollouts
MODELS = {"llada-countdown": (16, 16, "none"), "sdar-countdown": (32, None, "none")}
SLOW_ENV = "DLLM_RL_BENCH_SLOW_S"
#: what the runs are timed with: the main thread's CPU time, where one torch thread does all the work, so the machine's
#: other tenants do not count (wall-clock ratios moved 42x -> 25x under load here); the gate's test gives its own
CLOCK = time.thread_time


def demo_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first ``n`` held-out Countdown puzzles as the demo's compact prompts, tokenized."""
    with open(DEMO / "countdown_heldout.jsonl") as fh:
        rows = [json.loads(line) for _, line in zip(range(n), fh)]
    texts = [f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n" for r in rows]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@torch.no_grad()
def reference_decode(model, prompt: list[int], gen_length: int, block: int) -> list[int]:
    """Greedy masked-diffusion decoding of one prompt, the plain way: ``gen_length`` forward passes over the whole
    sequence, each committing the most confident masked slot of the current block (blocks left to right)."""
    ids = torch.tensor([prompt + [model.mask_token_id] * gen_length], device=model.device)
    start = len(prompt)
    for step in range(gen_length):
        lo = start + (step // block) * block
        logits = model(ids).logits[0, lo:lo + block].float()
        conf, token = logits.softmax(-1).max(-1)
        conf[ids[0, lo:lo + block] != model.mask_token_id] = -1.0
        slot = int(conf.argmax())
        ids[0, lo + slot] = token[slot]
    return ids[0, start:].tolist()


def medians(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Each run's median time over ``rounds``, the runs interleaved within each round."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = CLOCK()
            run()
            times[name].append(CLOCK() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def check(ratios: dict[str, float], floors: dict[str, float]) -> list[str]:
    """The lines of the ratios that fall below their floor (a model without a floor is a failure too)."""
    bad = []
    for name, ratio in ratios.items():
        floor = floors.get(name)
        if floor is None:
            bad.append(f"{name}: no floor in {FLOOR.name}; run benchmarks/bench.py --write-floor")
        elif ratio < floor:
            bad.append(f"{name}: {ratio:.2f}x the reference, below its floor {floor:.2f}x")
    return bad


def gate(pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]], floors: dict[str, float],
         rounds: int) -> tuple[dict[str, float], list[str]]:
    """Per model: (reference, fast) run interleaved ``rounds`` times, the ratio of their median times; and the
    failures of :func:`check`."""
    ratios = {}
    for name, (reference, fast) in pairs.items():
        t = medians({"reference": reference, "fast": fast}, rounds)
        ratios[name] = t["reference"] / max(t["fast"], 1e-12)
        print(f"{name:16s} reference {t['reference']:7.3f} s  fast {t['fast']:7.3f} s  ratio {ratios[name]:6.2f}x  "
              f"floor {floors.get(name, float('nan')):.2f}x", flush=True)
    return ratios, check(ratios, floors)


def demo_pair(name: str, n_prompts: int) -> tuple[Callable[[], object], Callable[[], object]]:
    """The reference and fast runs of demo model ``name`` on its first ``n_prompts`` puzzles."""
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import DecodeConfig, generate_batched

    gen_length, block_length, cache = MODELS[name]
    model = load_model(str(DEMO / name), dtype=torch.float32, device="cpu").eval()
    prompts = demo_prompts(load_tokenizer(str(DEMO / name)), n_prompts)
    block = model.block_size if model.is_block_causal else block_length
    config = DecodeConfig(gen_length=gen_length, block_length=block, steps=None, threshold=0.9, temperature=0.0,
                          cache=cache)
    slow = float(os.environ.get(SLOW_ENV, "0") or 0)

    def reference():
        return [reference_decode(model, p, gen_length, block) for p in prompts]

    def fast():
        if slow:  # the gate's own check: a slowed fast path must fail it (a busy wait: CPU time is what counts)
            until = time.thread_time() + slow
            while time.thread_time() < until:
                pass
        return generate_batched(model, prompts, config, batch_size=len(prompts))

    return reference, fast


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32, help="held-out puzzles per run (the fast run's batch)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved runs of each path; the median counts")
    parser.add_argument("--write-floor", action="store_true", help="store 0.7 x the measured ratios as the floors")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    floors = json.loads(FLOOR.read_text()) if FLOOR.is_file() else {}
    pairs = {name: demo_pair(name, args.prompts) for name in MODELS}
    for reference, fast in pairs.values():  # warm-up: first-call allocations out of the timings
        reference(), fast()
    ratios, bad = gate(pairs, floors, args.rounds)
    if args.write_floor:
        FLOOR.write_text(json.dumps({k: round(0.7 * v, 2) for k, v in ratios.items()}, indent=2) + "\n")
        print(f"floors written to {FLOOR}")
        return 0
    for line in bad:
        print(f"FAIL {line}", file=sys.stderr)
    print("bench: " + ("FAILED" if bad else "ok, every ratio at or above its floor"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
