"""Serving benchmark: a Poisson arrival trace replayed on the continuous-batching engine and on fixed batches, in
one run, on both text demo models.

    .venv/bin/python benchmarks/serve.py                # 64 requests a demo model, 8 slots, CPU, one thread
    .venv/bin/python benchmarks/serve.py --quick        # smoke run (16 requests)
    .venv/bin/python benchmarks/serve.py --http         # the HTTP server under 1, 8, 32 concurrent clients

**The trace** (``--requests``, ``--rate`` requests/s, ``--seed``): arrival gaps drawn from an exponential
distribution (a Poisson process); each request is 1, 2 or 4 held-out Countdown puzzles in the demo's compact style
(prompts of about 20, 40 and 80 tokens) with ``max_tokens`` 8, 16 or 32, decoded as rollouts are (temperature 1,
threshold 0.9, EOS stops, its own seed). The same trace, to the same clock, is replayed through:

* ``engine``: what ``dllm-rl serve``'s worker runs: an arrived request is queued at once, and the engine steps while
  it holds any (:class:`~dllm_rl.sampling.engine.Engine`, ``--slots``); after each step the running requests'
  settled text is read, as for a stream.
* ``fixed``: a static-batching server: when the decoder is free it takes up to ``--slots`` waiting requests and
  decodes them with one ``generate`` (``gen_length`` the batch's largest ``max_tokens``, each answer cut to its own),
  answering all of them when the batch ends; requests arriving meanwhile wait for the next batch.

Reported per model and mode: answer tokens/s and requests/s (from the first arrival to the last answer), time to
the first settled token (TTFT: for ``fixed`` the batch's end, since ``generate`` hands nothing back before), p50 and
p99 of TTFT and of latency (arrival to answer), and the engine's bytes copied per step (``Engine.copies``: keys and
values stored and moved, mean and largest step) beside its KV pool. The in-process replay leaves HTTP out, which
costs both modes the same per request; ``--http`` measures the server itself. ``--json PATH`` writes the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dllm_rl

DEMO = Path(dllm_rl.__file__).parent / "assets" / "demo"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))


def _bodies(n: int, gen: int) -> list[dict]:
    rows = [json.loads(line) for line in (DEMO / "countdown_heldout.jsonl").read_text().splitlines()]
    return [{"prompt": f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n", "max_tokens": gen,
             "temperature": 1.0, "threshold": 0.9, "seed": i} for i, r in enumerate(rows[:n])]


def _write_adapters(root: Path, k: int) -> dict[str, str]:
    """``k`` LoRA adapters of the demo model with random B matrices (a fresh adapter changes nothing)."""
    import torch

    from dllm_rl.models import load_model
    from dllm_rl.training.lora import LoraOptions, apply_lora, save_adapter

    out = {}
    for i in range(k):
        model = apply_lora(load_model(DEMO / "sdar-countdown"), LoraOptions(enabled=True, r=8), seed=i)
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, p in model.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        save_adapter(model, root / f"lora{i}")
        out[f"lora{i}"] = str(root / f"lora{i}")
    return out


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def _run(client, bodies: list[dict], clients: int) -> dict:
    def one(body):
        t0 = time.perf_counter()
        r = client.post("/v1/completions", json=body)
        r.raise_for_status()
        out = r.json()
        return time.perf_counter() - t0, out["choices"][0]["text"], out["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    if clients == 0:
        results = [one(b) for b in bodies]
    else:
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, bodies))
    wall = time.perf_counter() - t0
    lat = [r[0] for r in results]
    tokens = sum(r[2] for r in results)
    return {"wall_s": wall, "tok_s": tokens / wall, "req_s": len(bodies) / wall, "p50_s": _percentile(lat, 50),
            "p99_s": _percentile(lat, 99), "tokens": tokens, "texts": [r[1] for r in results]}


def http_main(argv: list[str] | None = None) -> int:
    """``--http``: the HTTP server under 1, 8 and 32 concurrent clients against sequential calls."""
    ap = argparse.ArgumentParser(description="serve benchmark --http: concurrent clients over HTTP")
    ap.add_argument("--http", action="store_true")
    ap.add_argument("--quick", action="store_true", help="16 requests instead of 64")
    ap.add_argument("--requests", type=int, default=None, help="requests per mode (default 64; --quick 16)")
    ap.add_argument("--gen", type=int, default=32, help="max_tokens of every request (default 32)")
    ap.add_argument("--slots", type=int, default=32, help="the server's slots (default 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--adapters", type=int, default=0, help="also serve this many LoRA adapters, the requests "
                    "round-robin over them and the base model (default 0)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import httpx
    import torch
    from serve_helpers import running

    from dllm_rl.sampling import DecodeConfig
    from dllm_rl.serve.cli import build_server
    from dllm_rl.serve.config import ServeConfig

    torch.set_num_threads(args.threads)
    n = args.requests or (16 if args.quick else 64)
    bodies = _bodies(n, args.gen)
    tmp = tempfile.TemporaryDirectory()
    loras = _write_adapters(Path(tmp.name), args.adapters) if args.adapters else None
    for i, body in enumerate(bodies):
        if loras and i % (len(loras) + 1):
            body["model"] = list(loras)[i % (len(loras) + 1) - 1]
    server = build_server(str(DEMO / "sdar-countdown"), DecodeConfig(gen_length=args.gen, threshold=0.9),
                          ServeConfig(slots=args.slots, max_queue=4 * n), device=args.device, loras=loras)
    modes = {"sequential": 0, "c1": 1, "c8": 8, "c32": 32}
    with running(server) as url, httpx.Client(base_url=url, timeout=600) as client:
        _run(client, bodies[:2], 0)  # warm-up
        results = {name: _run(client, bodies, c) for name, c in modes.items()}
    base = results["sequential"]
    same = {name: r["texts"] == base["texts"] for name, r in results.items()}
    print(f"serve benchmark: {n} requests, max_tokens {args.gen}, {args.slots} slots, demo sdar-countdown"
          f"{f' and {args.adapters} LoRA adapters' if args.adapters else ''}, {args.device}, {args.threads} thread(s)")
    print(f"{'mode':<11}{'tok/s':>9}{'req/s':>8}{'p50 s':>8}{'p99 s':>8}{'x tok/s':>9}{'x p50':>7}{'x p99':>7}  same")
    report = {}
    for name, r in results.items():
        ratios = {"tok_s": r["tok_s"] / base["tok_s"], "p50": r["p50_s"] / base["p50_s"],
                  "p99": r["p99_s"] / base["p99_s"]}
        print(f"{name:<11}{r['tok_s']:>9.1f}{r['req_s']:>8.2f}{r['p50_s']:>8.3f}{r['p99_s']:>8.3f}"
              f"{ratios['tok_s']:>9.2f}{ratios['p50']:>7.2f}{ratios['p99']:>7.2f}  {same[name]}")
        report[name] = {k: v for k, v in r.items() if k != "texts"} | {"ratio_to_sequential": ratios,
                                                                       "same_answers": same[name]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(same.values()) else 1



# ---- the Poisson trace -------------------------------------------------------------------------------------------
TEXT_DEMOS = (("sdar-countdown", 4), ("llada-countdown", 8))  # (model, decoding block)
PUZZLES = (1, 2, 4)  # puzzles per prompt
ANSWERS = (8, 16, 32)  # max_tokens


@dataclass
class Request:
    arrival: float  # seconds after the trace starts
    ids: list[int]
    gen: int  # max_tokens
    seed: int


def poisson_trace(tokenizer, n: int, rate: float, seed: int) -> list[Request]:
    rows = [json.loads(line) for line in (DEMO / "countdown_heldout.jsonl").read_text().splitlines()]
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        k = rng.choice(PUZZLES)
        text = "".join(f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n"
                       for r in (rows[(7 * i + j) % len(rows)] for j in range(k)))
        out.append(Request(t, tokenizer(text, add_special_tokens=False)["input_ids"], rng.choice(ANSWERS), i))
    return out


class Clock:
    """The trace's clock: which requests have arrived, and waiting for the next one when idle."""

    def __init__(self, trace: list[Request]):
        self.trace, self.next, self.t0 = trace, 0, time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def arrived(self) -> list[int]:
        now, out = self.now(), []
        while self.next < len(self.trace) and self.trace[self.next].arrival <= now:
            out.append(self.next)
            self.next += 1
        return out

    def idle(self) -> None:
        if self.next < len(self.trace):
            time.sleep(max(0.0, self.trace[self.next].arrival - self.now()))


def replay_engine(model, cfg, trace: list[Request], slots: int) -> dict:
    """The engine with its KV pool bounded by the trace's longest request (``--max-positions`` of a server)."""
    from dllm_rl.sampling.canvas import canvas_width
    from dllm_rl.sampling.engine import Engine, EngineConfig
    from dllm_rl.sampling.inputs import decode_block_length
    from dllm_rl.sampling.sequence import settled

    block = decode_block_length(model, cfg)
    bound = max(canvas_width(len(r.ids), r.gen, block, model.is_block_causal) for r in trace)
    engine = Engine(model, cfg, EngineConfig(slots=slots, max_positions=bound))
    clock, eos = Clock(trace), model.eos_token_id
    index, first, end, tokens, copied = {}, {}, {}, {}, []
    while len(end) < len(trace):
        for i in clock.arrived():
            index[engine.add_request(trace[i].ids, seed=trace[i].seed, gen_length=trace[i].gen)] = i
        if not engine.has_unfinished():
            clock.idle()
            continue
        finished = engine.step()
        copied.append(engine.copies.last_step)
        now = clock.now()
        for c in finished:
            i = index[c.request_id]
            end[i], tokens[i] = now, int(c.rollout.completion_mask.sum())
            first.setdefault(i, now)
        watch = [rid for rid, i in index.items() if i not in first and i not in end]
        for rid, (ids, todo) in engine.completions(watch).items():
            got, ended = settled(ids, todo, eos)
            if got or ended:
                first[index[rid]] = now
    pool = engine.cache.nbytes() if engine.cache is not None else 0
    return _summary(trace, first, end, tokens) | {
        "steps": len(copied), "copied_mean_kib": statistics.fmean(copied) / 1024, "copied_max_kib": max(copied) / 1024,
        "kv_moved_kib": engine.copies.total["kv_moved"] / 1024, "pool_kib": pool / 1024}


def replay_fixed(model, cfg, trace: list[Request], slots: int) -> dict:
    from dllm_rl.sampling import generate

    clock, queue, end, tokens, batches = Clock(trace), [], {}, {}, 0
    while len(end) < len(trace):
        queue += clock.arrived()
        if not queue:
            clock.idle()
            continue
        batch, queue = queue[:slots], queue[slots:]
        gen = max(trace[i].gen for i in batch)
        out = generate(model, [trace[i].ids for i in batch], dataclasses.replace(cfg, gen_length=gen),
                       seeds=[trace[i].seed for i in batch])
        now, batches = clock.now(), batches + 1
        for j, i in enumerate(batch):
            end[i], tokens[i] = now, int(out.completion_mask[j, : trace[i].gen].sum())
    return _summary(trace, dict(end), end, tokens) | {"steps": batches}


def _summary(trace: list[Request], first: dict, end: dict, tokens: dict) -> dict:
    wall = max(end.values()) - trace[0].arrival
    ttft = [first[i] - r.arrival for i, r in enumerate(trace)]
    lat = [end[i] - r.arrival for i, r in enumerate(trace)]
    return {"wall_s": wall, "tok_s": sum(tokens.values()) / wall, "req_s": len(trace) / wall,
            "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99),
            "p50_s": _percentile(lat, 50), "p99_s": _percentile(lat, 99), "tokens": sum(tokens.values())}


def _print_trace(name: str, results: dict) -> None:
    print(f"  {name}")
    print(f"    {'mode':<7}{'tok/s':>8}{'req/s':>7}{'TTFT p50':>9}{'p99':>7}{'lat p50':>8}{'p99':>7}  KV copied/step "
          f"KiB mean / max (moved in all; KV pool KiB)")
    for mode, r in results.items():
        copies = (f"  {r['copied_mean_kib']:.1f} / {r['copied_max_kib']:.1f} ({r['kv_moved_kib']:.0f}; "
                  f"{r['pool_kib']:.0f})"
                  if "copied_mean_kib" in r else "  -")
        print(f"    {mode:<7}{r['tok_s']:>8.1f}{r['req_s']:>7.2f}{r['ttft_p50_s']:>9.2f}{r['ttft_p99_s']:>7.2f}"
              f"{r['p50_s']:>8.2f}{r['p99_s']:>7.2f}{copies}")
    print(f"    engine / fixed, tok/s: {results['engine']['tok_s'] / results['fixed']['tok_s']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--http" in argv:
        return http_main(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http", action="store_true", help="the HTTP server under concurrent clients instead")
    ap.add_argument("--quick", action="store_true", help="16 requests instead of 64")
    ap.add_argument("--requests", type=int, default=None, help="requests per model (default 64; --quick 16)")
    ap.add_argument("--rate", type=float, default=16.0, help="mean arrivals per second (default 16)")
    ap.add_argument("--slots", type=int, default=8, help="the engine's slots = the fixed batches' size (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="the trace's seed (default 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--models", nargs="+", default=[m for m, _ in TEXT_DEMOS], help="demo models (default both)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import DecodeConfig, generate

    torch.set_num_threads(args.threads)
    n = args.requests or (16 if args.quick else 64)
    print(f"serve benchmark: Poisson trace of {n} requests at {args.rate:g}/s (1, 2 or 4 puzzles a prompt, max_tokens "
          f"8, 16 or 32), temperature 1, threshold 0.9; engine with {args.slots} slots vs fixed batches of "
          f"{args.slots}; {args.device}, {args.threads} thread(s)")
    report = {}
    for name, block in TEXT_DEMOS:
        if name not in args.models:
            continue
        model = load_model(DEMO / name, device=args.device)
        trace = poisson_trace(load_tokenizer(DEMO / name), n, args.rate, args.seed)
        cfg = DecodeConfig(gen_length=max(ANSWERS), block_length=block, threshold=0.9, temperature=1.0)
        generate(model, [trace[0].ids], cfg)  # warm-up
        report[name] = {"engine": replay_engine(model, cfg, trace, args.slots),
                        "fixed": replay_fixed(model, cfg, trace, args.slots)}
        _print_trace(name, report[name])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
