"""What TraceRL's diffusion value model buys on the demo task (the shipped block-4 SDAR Countdown model).

    python benchmarks/value.py                         # both parts, short defaults
    python benchmarks/value.py --part variance --batches 16 --warm-steps 40
    python benchmarks/value.py --part accuracy --seeds 0 1 2 3 --steps 100 --eval-limit 500

The defaults are short: 8 value-fitting steps and 6 batches; 8 RL steps per run, 2 seeds, 100 puzzles. On one
idle CPU thread that is minutes per part; on this project's loaded 2-core machine (load average ~10) the
variance part took 31 min and each RL run 6-10 min. Runs whose ``summary.json`` exists are not rerun, so two
invocations with different ``--seeds`` can share the work and a third prints the table.

Part 1, variance of the policy-gradient estimate: the policy is frozen at the shipped checkpoint; a value model
is first fitted for ``--warm-steps`` value-only steps on fresh rollouts (the policy does not move). Then
``--batches`` fresh rollout batches (16 prompts x 8 samples each, new prompts and rollout noise per batch) are
drawn, and on each the gradient of TraceRL's token loss is computed with three advantages on the same rollouts:
the group z-score (TraceRL without a value model), the value model's GAE advantages ``R - V`` (gamma = lam = 1),
and those whitened. Printed per variant: the across-batch variance ``E||g - mean g||^2`` and the relative
variance ``E||g - mean g||^2 / ||mean g||^2`` (scale-free: the advantages differ in scale), each as a ratio to
the group z-score's.

Part 2, held-out accuracy: TraceRL from the shipped checkpoint with and without the value model, at the demo
learning rate (1e-4) and at twice it, ``--steps`` RL steps per run, over ``--seeds``; greedy accuracy on
``--eval-limit`` held-out puzzles. Printed: before, after per seed, the mean gain and the ratio of the mean gains.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from dllm_rl.config import load_config
from dllm_rl.rl.advantages import compute_advantages
from dllm_rl.rl.cli import demo_config_path, demo_overrides
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig

DEMO_LR = 1e-4


def _trainer(out: Path, seed: int, value_lr: float):
    from dllm_rl.rl.trainer import RLTrainer

    cfg = load_config(RLConfig, demo_config_path("block"), demo_overrides("block") + [
        "algorithm=tracerl", f"run.seed={seed}", f"run.output_dir={out}", "run.overwrite=true", "run.progress=false",
        "eval.limit=0",
        "value_model.enabled=true", f"value_model.lr={value_lr}"])
    return RLTrainer(cfg)


def _round(trainer, step: int):
    """One fresh rollout batch of the frozen policy: the kept batch (every sample), rewards, value targets."""
    trainer.step_idx = trainer.collector.step_idx = step
    idx = trainer.stream.take(trainer.cfg.train.prompts_per_step)
    rnd = trainer.collector.round(trainer.model, idx, first_sample=0)
    keep = torch.arange(len(rnd.rewards))
    batch = trainer.updater.batch(rnd.rollout, keep, rnd.seeds)
    rewards = torch.tensor(rnd.rewards)
    return batch, rewards, trainer.value.targets(batch, rewards)


def _gradient(trainer, batch, adv: torch.Tensor) -> torch.Tensor:
    """The flattened gradient of TraceRL's token loss (first pass: ratio 1) on ``batch`` with advantages ``adv``."""
    model = trainer.model
    model.model.zero_grad(set_to_none=True)
    new = trainer.updater.scores(model, batch, 0)
    old = replace(new, logp=new.logp.detach())
    loss_cfg = LossConfig.from_rl_config(trainer.cfg, max_length=batch.completion_len)
    POLICY_LOSSES["token"](new, old, None, adv, batch.lengths, loss_cfg).loss.backward()
    grads = [p.grad.flatten() for p in model.model.parameters() if p.grad is not None]
    out = torch.cat(grads).detach().clone()
    model.model.zero_grad(set_to_none=True)
    return out


def variance_part(args) -> dict:
    trainer = _trainer(Path(args.out) / "variance", args.seed, args.value_lr)
    t0 = time.perf_counter()
    for k in range(args.warm_steps):  # fit the value model to the frozen policy
        batch, _, t = _round(trainer, k)
        stats = trainer.value.update(batch, t)
        if k % 10 == 0 or k == args.warm_steps - 1:
            print(f"  value warm-up step {k}: loss {stats['value_loss']:.4f}, explained variance "
                  f"{stats['value_explained_var']:.3f}", flush=True)
    grads: dict[str, list[torch.Tensor]] = {"group z-score": [], "value R - V": [], "value R - V, whitened": []}
    G = trainer.cfg.rollout.num_generations
    for k in range(args.batches):
        batch, rewards, t = _round(trainer, 10_000 + k)
        z = compute_advantages("group_zscore", rewards, G, "group").to(trainer.model.device)
        w = t.advantages
        whitened = torch.where(t.mask, (w - w[t.mask].mean()) / (w[t.mask].std(unbiased=False) + 1e-8), 0.0)
        for name, adv in zip(grads, (z, w, whitened)):
            grads[name].append(_gradient(trainer, batch, adv))
    rows = {}
    for name, gs in grads.items():
        g = torch.stack(gs).double()
        mean = g.mean(0)
        var = float(((g - mean) ** 2).sum(-1).mean())
        rows[name] = {"variance": var, "relative_variance": var / float((mean ** 2).sum())}
    base = rows["group z-score"]
    print(f"\nPolicy-gradient variance over {args.batches} batches of {trainer.cfg.train.prompts_per_step}x{G} "
          f"rollouts "
          f"(value model fitted for {args.warm_steps} steps at lr {args.value_lr}; {time.perf_counter() - t0:.0f}s)")
    print("| advantage | variance / group z-score's | relative variance / group z-score's |")
    print("|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['variance'] / base['variance']:.3f} | "
              f"{r['relative_variance'] / base['relative_variance']:.3f} |")
    return rows


def _run(out: Path, seed: int, lr: float, value: bool, steps: int, eval_limit: int, value_lr_ratio: float) -> dict:
    summary = out / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text())
    extra = ["value_model.enabled=true", f"value_model.lr={lr * value_lr_ratio}"] if value else []
    cmd = [sys.executable, "-m", "dllm_rl", "rl", str(demo_config_path("block")), *demo_overrides("block"),
           "algorithm=tracerl", f"run.seed={seed}", f"optim.lr={lr}", f"train.max_steps={steps}",
           "train.max_time_minutes=null",
           f"eval.limit={eval_limit}", f"run.output_dir={out}", "run.overwrite=true", "run.progress=false",
           "log.samples_every=0",
           *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(summary.read_text())


def accuracy_part(args) -> dict:
    results: dict[tuple[float, bool], list[dict]] = {}
    for lr in (DEMO_LR, 2 * DEMO_LR):
        for value in (False, True):
            for seed in args.seeds:
                out = Path(args.out) / f"lr{lr:g}-{'value' if value else 'novalue'}-s{seed}"
                t0 = time.perf_counter()
                s = _run(out, seed, lr, value, args.steps, args.eval_limit, args.value_lr_ratio)
                results.setdefault((lr, value), []).append(s)
                print(f"  lr {lr:g} value={value} seed {seed}: {s['accuracy_before']:.3f} -> {s['accuracy_after']:.3f}"
                      f" ({time.perf_counter() - t0:.0f}s)", flush=True)
    print(f"\nTraceRL held-out accuracy, {args.steps} steps, {args.eval_limit} held-out puzzles, seeds {args.seeds}")
    # the ratio of mean accuracies after training (a ratio of gains is meaningless when a gain is 0 or negative)
    print("| lr | value model | before | after per seed | mean gain | mean after, with / without |")
    print("|---|---|---|---|---|---|")
    table = {}
    for lr in (DEMO_LR, 2 * DEMO_LR):
        after = {v: statistics.mean(r["accuracy_after"] for r in results[(lr, v)]) for v in (False, True)}
        for value in (False, True):
            runs = results[(lr, value)]
            gain = statistics.mean(r["accuracy_after"] - r["accuracy_before"] for r in runs)
            per_seed = ", ".join(f"{r['accuracy_after']:.3f}" for r in runs)
            ratio = f"{after[True] / after[False]:.2f}" if value and after[False] > 0 else ""
            print(f"| {lr:g} | {'yes' if value else 'no'} | {runs[0]['accuracy_before']:.3f} | {per_seed} | "
                  f"{gain:+.3f} | {ratio} |")
            table[f"lr={lr:g},value={value}"] = {"gain": gain, "runs": runs}
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("variance", "accuracy", "both"), default="both")
    ap.add_argument("--out", default="runs/bench-value")
    ap.add_argument("--seed", type=int, default=0, help="variance part: the seed of its prompt and rollout streams")
    ap.add_argument("--batches", type=int, default=6, help="variance part: rollout batches the variance is over")
    ap.add_argument("--warm-steps", type=int, default=8, help="variance part: value-only fitting steps first")
    ap.add_argument("--value-lr", type=float, default=1e-3, help="variance part: the value model's lr")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1], help="accuracy part: seeds per setting")
    ap.add_argument("--steps", type=int, default=8, help="accuracy part: RL steps per run")
    ap.add_argument("--eval-limit", type=int, default=100, help="accuracy part: held-out puzzles")
    ap.add_argument("--value-lr-ratio", type=float, default=5.0,
                    help="accuracy part: the value model's lr as a multiple of the policy's (published: 5)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = {}
    if args.part in ("variance", "both"):
        report["variance"] = variance_part(args)
    if args.part in ("accuracy", "both"):
        report["accuracy"] = accuracy_part(args)
    (Path(args.out) / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
