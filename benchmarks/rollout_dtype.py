"""Rollouts decoded by a bfloat16 copy of the policy (``rollout.dtype``) vs the float32 policy itself.

    .venv/bin/python benchmarks/rollout_dtype.py [--threads 1] [--rounds 3] [--model full|block]

On the shipped demo checkpoint and its RL config, one RL step's rollouts (``prompts_per_step`` x
``num_generations`` sequences from the training file, at the config's temperature) are decoded by the float32
policy and by a :class:`~dllm_rl.rl.rollout_copy.RolloutCopy` in bfloat16 (its refresh from the policy is
timed with it). Rounds interleave the two and the best time of the rounds is kept; the ratio is the figure.
How far the rounding moves the policy: the share of held-out prompts whose greedy completion is the same
token for token, and the greedy accuracy of each on those prompts. The speed-up needs a CPU or GPU that
computes bfloat16 matrix products natively (e.g. AMX or AVX512-BF16); elsewhere bfloat16 can be slower.
"""

from __future__ import annotations

import argparse
import time

import torch

from dllm_rl.config import load_config
from dllm_rl.eval.heldout import encode_prompts, heldout_accuracy
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.rl.cli import demo_config_path, demo_overrides
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.rollout_copy import RolloutCopy
from dllm_rl.rl.trainer import decode_config
from dllm_rl.sampling import generate_batched
from dllm_rl.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("full", "block"), default="full")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the learning runs use 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heldout", type=int, default=128, help="held-out prompts for the greedy agreement")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(RLConfig, demo_config_path(args.model), demo_overrides(args.model))
    policy = load_model(cfg.model, dtype="float32").eval()
    tok = load_tokenizer(cfg.model, mask_token_id=policy.mask_token_id)
    copy_ = RolloutCopy(policy, torch.bfloat16)
    train = get_task(cfg.task, data=cfg.train_data, split="train", prompt_style=cfg.prompt_style)
    _, ids = encode_prompts(train, [train[i] for i in range(cfg.prompts_per_step)], tok)
    group = [p for p in ids for _ in range(cfg.num_generations)]
    seeds = list(range(len(group)))
    dec = decode_config(cfg, policy)

    def rollout(which: str) -> float:
        t0 = time.perf_counter()
        model = policy if which == "float32" else copy_.refresh()
        with torch.no_grad():
            generate_batched(model, group, dec, seeds=seeds, tokenizer=tok, batch_size=cfg.rollout.batch_size)
        return time.perf_counter() - t0

    best = {"float32": float("inf"), "bfloat16": float("inf")}
    for _ in range(args.rounds):
        for which in best:
            best[which] = min(best[which], rollout(which))
    print(f"== {args.model} demo model, {len(group)} rollouts of {cfg.rollout.gen_length} tokens, "
          f"{args.threads} thread(s), best of {args.rounds}")
    for which, t in best.items():
        print(f"{which:<9} rollout {t:6.2f} s")
    print(f"bfloat16 copy vs float32 policy: {best['float32'] / best['bfloat16']:.2f}x faster rollouts")

    held = get_task(cfg.task, data=cfg.eval.data, split="test", prompt_style=cfg.prompt_style,
                    limit=args.heldout)
    greedy = decode_config(cfg, policy, evaluation=True)
    res = {which: heldout_accuracy(model, tok, held, held.examples, greedy, batch_size=cfg.rollout.batch_size)
           for which, model in (("float32", policy), ("bfloat16", copy_.refresh()))}
    same = sum(a == b for a, b in zip(res["float32"].texts, res["bfloat16"].texts, strict=True))
    print(f"greedy on {len(held.examples)} held-out prompts: identical completions {same / len(held.examples):.1%}; "
          f"accuracy float32 {res['float32'].accuracy:.1%}, bfloat16 {res['bfloat16'].accuracy:.1%}")


if __name__ == "__main__":
    main()
