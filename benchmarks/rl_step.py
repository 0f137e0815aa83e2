"""Cost of one RL step, split by stage, and the per-sample scoring cost of every estimator.

    python benchmarks/rl_step.py [--quick]

Prints (1) rollout / reward / scoring / update seconds of one step on a tiny model, (2) for each
estimator: forwards per sample, tokens per forward and seconds per sample, and (3) checks the TraceRL
cost claim on a block model: at most ceil(steps_per_block / s) forwards of length prompt + 2 x response
per sample. Ratios and counts come from one run on this machine; absolute seconds are indicative only.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from dllm_rl.estimators import ScoringBatch, estimate
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.advantages import group_zscore
from dllm_rl.rl.losses import LossConfig, token_clipped_loss
from dllm_rl.sampling import DecodeConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a smoke run")
    args = ap.parse_args()
    torch.set_num_threads(2)
    layers, hidden = (2, 64) if args.quick else (4, 256)
    n_prompts, group, prompt_len, gen = (2, 4, 16, 16) if args.quick else (4, 8, 32, 64)
    V = 256
    results = {}
    for family in ("llada", "sdar"):
        cfg = tiny_config(family, vocab_size=V, hidden_size=hidden, num_layers=layers, num_heads=4, num_kv_heads=2,
                          intermediate_size=hidden * 3, block_size=4)
        model = build_model(family, cfg, seed=0)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, V - 3, (prompt_len,), generator=g).tolist() for _ in range(n_prompts)]
        ids = [p for p in prompts for _ in range(group)]
        block = 4 if family == "sdar" else 32 if gen >= 32 else gen
        dec = DecodeConfig(gen_length=gen, block_length=block, steps=block, temperature=1.0,
                           cache="prefix" if family == "llada" else "none")
        t0 = time.perf_counter()
        with torch.no_grad():
            roll = generate(model, ids, dec, seeds=list(range(len(ids))))
        t_roll = time.perf_counter() - t0
        t0 = time.perf_counter()
        rewards = torch.tensor([float(sum(roll.completion_ids[i].tolist()) % 2) for i in range(len(ids))])
        adv = group_zscore(rewards, group)
        t_rew = time.perf_counter() - t0
        batch = ScoringBatch.from_rollout(roll)
        B, R = batch.batch_size, batch.completion_len
        print(f"\n== {family}: {layers} layers, hidden {hidden}, {B} samples, prompt {prompt_len}, response {R}")
        print(f"{'estimator':<14}{'forwards/sample':>16}{'tokens/forward':>16}{'s/sample':>10}")
        shrink = 1 if family == "sdar" else 8
        for name, opts in [("trace", {"shrinkage": shrink}), ("trace", {"shrinkage": 2 * shrink}),
                           ("elbo", {"num_mc": 2, "coupled": True}), ("mean_field", {}), ("random_mask", {}),
                           ("coupled", {})]:
            t0 = time.perf_counter()
            with torch.no_grad():
                sc = estimate(model, name, batch, torch.Generator().manual_seed(1), **opts)
            dt = time.perf_counter() - t0
            label = f"{name}" + (f"(s={opts['shrinkage']})" if name == "trace" else "")
            print(f"{label:<14}{sc.forwards / B:>16.2f}{sc.forward_tokens / max(sc.forwards, 1):>16.1f}{dt / B:>10.4f}")
            results[(family, label)] = sc
        # one update: forward + backward of the preset's estimator
        model.train()
        t0 = time.perf_counter()
        new = estimate(model, "trace", batch, torch.Generator().manual_seed(1), shrinkage=shrink)
        out = token_clipped_loss(new, new, None, adv, batch.lengths, LossConfig())
        out.loss.backward()
        t_upd = time.perf_counter() - t0
        model.eval()
        total = t_roll + t_rew + t_upd
        print(f"step split: rollout {t_roll:.2f}s ({t_roll / total:.0%}), reward {t_rew:.3f}s, "
              f"update {t_upd:.2f}s ({t_upd / total:.0%}); rollout NFE/sample {roll.nfe.float().mean():.1f}")
        if family == "sdar":
            steps_per_block = 4  # one token per step, block 4
            for s in (1, 2):
                sc = results[(family, f"trace(s={s})")]
                bound = math.ceil(steps_per_block / s)
                per_sample = sc.forwards / B
                tokens = sc.forward_tokens / max(sc.forwards, 1)
                ok = per_sample <= bound and tokens <= prompt_len + 2 * R
                print(f"TraceRL block cost s={s}: {per_sample:.2f} forwards/sample (bound {bound}), "
                      f"{tokens:.0f} tokens/forward (bound {prompt_len + 2 * R}) -> {'OK' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
