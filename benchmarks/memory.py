"""Activation memory of one RL update against the vocabulary size, with the chunked LM head on and off.

    python benchmarks/memory.py [--quick] [--estimators trace elbo ...] [--chunk 256]

For each estimator, one RL update as the trainer runs it with one pass over one micro-batch (log-probs with
grad, the old policy = their detached copy, the policy loss, backward, AdamW step) on 8 rollouts of prompt
256 + completion 512 tokens, on a Qwen3-shaped block model (SDAR family: every estimator scores in the
two-stream layout; ``ar``, which needs full attention, on the Qwen2-shaped Dream family) with vocabulary
151,936 and with 4,096, everything else equal. The hidden size is small (128, 4 layers) so that, as at
scale, the vocabulary dominates activation memory when the ``[positions, V]`` logits are materialised.
Printed: the peak memory above the resident weights, gradients and optimizer states of each run, and the
ratio large / small vocabulary with chunking on (``logprob_chunk_size``) and off (0), measured side by
side in one run.

What is measured: each configuration runs in its own subprocess. On CPU, the process's peak resident set
(``VmHWM``) is reset (``/proc/self/clear_refs``) once the weights, gradients (allocated, zeroed) and the
AdamW states exist, and the peak is read after the update; the number is that peak minus the resident set
at the reset. glibc is told to serve every allocation over 64 KiB with its own mapping
(``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set at once and it tracks live memory.
On CUDA the same with ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. ``--quick``
shrinks the lengths (prompt 32 + completion 64, 4 rollouts) for a smoke run. Both modes use
``max_rows=4`` (rows per model call), so the off mode's transient logits stay within this machine's memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

# estimator -> (family, estimator options, policy loss): the algorithm presets' choices where one exists.
ESTIMATORS = {
    "mean_field": ("sdar", {"p_mask_prompt": 0.15}, "token"),  # one row per sample: the least activation memory
    "ar": ("dream", {}, "token"),
    "random_mask": ("sdar", {}, "token"),
    "block": ("sdar", {}, "token"),
    "coupled": ("sdar", {}, "token"),
    "elbo": ("sdar", {"num_mc": 2, "coupled": True}, "sequence"),
    "trace": ("sdar", {"shrinkage": 1}, "token"),
}
LARGE, SMALL = 151_936, 4_096
HIDDEN, LAYERS = 128, 4


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _batch(vocab: int, rollouts: int, prompt: int, completion: int, block: int):
    from dllm_rl.estimators import ScoringBatch

    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, vocab - 3, (rollouts, prompt), generator=g)
    prompt_mask = torch.ones(rollouts, prompt, dtype=torch.bool)
    prompt_mask[::2, : prompt // 8] = False  # every other prompt left-padded
    comp = torch.randint(0, vocab - 3, (rollouts, completion), generator=g)
    comp_mask = torch.ones(rollouts, completion, dtype=torch.bool)
    # Block decoding, one token per step: the tokens of block j are committed at steps block*j .. block*j + 3.
    perm = torch.stack([torch.randperm(block, generator=g) for _ in range(rollouts * completion // block)])
    step_map = (perm + torch.arange(perm.shape[0])[:, None] * block).reshape(rollouts, completion)
    return ScoringBatch(prompt_ids, prompt_mask, comp, comp_mask, step_map,
                        sample_seeds=torch.arange(rollouts))


def child(args: argparse.Namespace) -> dict:
    from dllm_rl.estimators import estimate
    from dllm_rl.models import build_model, tiny_config
    from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig

    torch.manual_seed(0)
    family, opts, loss_name = ESTIMATORS[args.estimator]
    cfg = tiny_config(family, vocab_size=args.vocab, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=4,
                      num_kv_heads=2, intermediate_size=3 * HIDDEN, block_size=4,
                      max_position_embeddings=2 * (args.prompt + 2 * args.completion))
    cuda = torch.cuda.is_available()
    model = build_model(family, cfg, seed=0)
    if cuda:
        model.to("cuda")
    model.train()
    batch = _batch(args.vocab, args.rollouts, args.prompt, args.completion, 4)
    if cuda:
        batch = batch.select(slice(None))
        batch = type(batch)(*(None if t is None else t.cuda() for t in (
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, batch.step_map)),
            sample_seeds=batch.sample_seeds)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-6, fused=True)  # fused: the step makes no weight-sized temporaries
    for p in params:
        p.grad = torch.zeros_like(p)
    optim.step()  # allocates the AdamW states
    optim.zero_grad(set_to_none=False)
    opts = {**opts, "max_rows": 4, "logprob_chunk_size": args.chunk}
    adv = torch.linspace(-1, 1, args.rollouts, device=model.device)

    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    new = estimate(model, args.estimator, batch, torch.Generator().manual_seed(1), **opts)
    old = dataclasses.replace(new, logp=new.logp.detach())
    out = POLICY_LOSSES[loss_name](new, old, None, adv, batch.lengths, LossConfig(max_length=args.completion))
    out.loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=False)
    peak = torch.cuda.max_memory_allocated() if cuda else _rss_kib("VmHWM") * 1024
    return {"peak_above": peak - base, "resident": base, "scored": int(new.scored().sum()),
            "loss": float(out.loss.detach()), "device": "cuda" if cuda else "cpu"}


def _run(script: Path, estimator: str, vocab: int, chunk: int, lengths: list[int]) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    cmd = [sys.executable, str(script), "--child", "--estimator", estimator, "--vocab", str(vocab),
           "--chunk", str(chunk), "--lengths", *map(str, lengths)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="prompt 32 + completion 64, 4 rollouts (smoke test)")
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    ap.add_argument("--chunk", type=int, default=None, help="logprob_chunk_size when on (default: the library's)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--estimator", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lengths", type=int, nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.rollouts, args.prompt, args.completion = args.lengths
        print(json.dumps(child(args)))
        return
    from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE

    chunk = DEFAULT_CHUNK_SIZE if args.chunk is None else args.chunk
    lengths = [4, 32, 64] if args.quick else [8, 256, 512]
    print(f"one RL update, {lengths[0]} rollouts of prompt {lengths[1]} + completion {lengths[2]}, hidden {HIDDEN}, "
          f"{LAYERS} layers; peak MiB above weights + gradients + AdamW states; chunk = {chunk} positions")
    print(f"{'estimator':<12}{'family':<7}{'V=' + str(LARGE) + ' on':>14}{'V=' + str(SMALL) + ' on':>12}"
          f"{'ratio on':>10}{'V=' + str(LARGE) + ' off':>15}{'V=' + str(SMALL) + ' off':>13}{'ratio off':>11}")
    worst = 0.0
    script = Path(__file__).resolve()
    for name in args.estimators:
        mib = {}
        for mode, c in (("on", chunk), ("off", 0)):
            for vocab in (LARGE, SMALL):
                mib[mode, vocab] = _run(script, name, vocab, c, lengths)["peak_above"] / 2**20
        on, off = mib["on", LARGE] / mib["on", SMALL], mib["off", LARGE] / mib["off", SMALL]
        worst = max(worst, on)
        print(f"{name:<12}{ESTIMATORS[name][0]:<7}{mib['on', LARGE]:>14.0f}{mib['on', SMALL]:>12.0f}{on:>10.2f}"
              f"{mib['off', LARGE]:>15.0f}{mib['off', SMALL]:>13.0f}{off:>11.2f}", flush=True)
    print(f"largest ratio large / small vocabulary with chunking on: {worst:.2f} "
          f"({'<=' if worst <= 1.5 else '>'} 1.5)")


if __name__ == "__main__":
    main()
