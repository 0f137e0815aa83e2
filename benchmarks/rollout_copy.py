"""Rollouts decoded by a copy of the policy (``rollout.dtype``, ``rollout.compile``) vs the float32 policy.

    .venv/bin/python benchmarks/rollout_copy.py [--threads 1] [--rounds 3] [--model full|block]

On the shipped demo checkpoint and its RL config, one RL step's rollouts (``prompts_per_step`` x
``num_generations`` sequences from the training file, at the config's temperature) are decoded by the float32
policy, by a :class:`~dllm_rl.rl.rollout_copy.RolloutCopy` in bfloat16, and by one in bfloat16 compiled with
``torch.compile`` (each copy's refresh from the policy is timed with it; the compile happens in a warm-up
rollout, timed on its own). Rounds interleave the three and the best time of the rounds is kept; the ratios
are the figures. How far each copy moves the policy: the share of held-out prompts whose greedy completion
is the same token for token as the float32 policy's, and the greedy accuracy of each on those prompts. The
bfloat16 speed-up needs a CPU or GPU that computes bfloat16 matrix products natively (e.g. AMX or
AVX512-BF16); elsewhere bfloat16 can be slower. The last line says what ``rollout.dtype: auto`` picks here.
"""

from __future__ import annotations

import argparse
import time

import torch

from dllm_rl.config import load_config
from dllm_rl.eval.heldout import heldout_accuracy
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.rl.cli import demo_config_path, demo_overrides
from dllm_rl.rl.config import RLConfig, decode_config
from dllm_rl.rl.rollout_copy import RolloutCopy, rollout_dtype
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
    policy = load_model(cfg.model.path, dtype="float32").eval()
    tok = load_tokenizer(cfg.model.path, mask_token_id=policy.mask_token_id)
    copies = {"bfloat16": RolloutCopy(policy, torch.bfloat16),
              "bf16+compile": RolloutCopy(policy, torch.bfloat16, compile=True)}
    train = get_task(cfg.data.task, data=cfg.data.train_file, split="train", prompt_style=cfg.data.prompt_style)
    _, ids, _ = PromptEncoder(tok).task_prompts(policy, train, [train[i] for i in range(cfg.train.prompts_per_step)])
    group = [p for p in ids for _ in range(cfg.rollout.num_generations)]
    seeds = list(range(len(group)))
    dec = decode_config(cfg, policy)

    def rollout(which: str) -> float:
        t0 = time.perf_counter()
        model = policy if which == "float32" else copies[which].refresh()
        with torch.no_grad():
            generate_batched(model, group, dec, seeds=seeds, tokenizer=tok, batch_size=cfg.rollout.batch_size)
        return time.perf_counter() - t0

    t_compile = rollout("bf16+compile")
    best = {which: float("inf") for which in ("float32", *copies)}
    for _ in range(args.rounds):
        for which in best:
            best[which] = min(best[which], rollout(which))
    print(f"== {args.model} demo model, {len(group)} rollouts of {cfg.rollout.gen_length} tokens, "
          f"{args.threads} thread(s), best of {args.rounds}")
    for which, t in best.items():
        print(f"{which:<13} rollout {t:6.2f} s")
    print(f"first compiled rollout (compiles): {t_compile:.1f} s")
    print(f"bfloat16 copy vs float32 policy: {best['float32'] / best['bfloat16']:.2f}x faster rollouts")
    print(f"compiled bfloat16 copy vs bfloat16 copy: {best['bfloat16'] / best['bf16+compile']:.2f}x faster; "
          f"vs float32 policy: {best['float32'] / best['bf16+compile']:.2f}x")

    held = get_task(cfg.data.task, data=cfg.eval.data, split="test", prompt_style=cfg.data.prompt_style,
                    limit=args.heldout)
    greedy = decode_config(cfg, policy, evaluation=True)
    models = {"float32": policy, **{k: c.refresh() for k, c in copies.items()}}
    res = {which: heldout_accuracy(model, tok, held, held.examples, greedy, batch_size=cfg.rollout.batch_size)
           for which, model in models.items()}
    print(f"greedy on {len(held.examples)} held-out prompts: float32 accuracy {res['float32'].accuracy:.1%}")
    for which in copies:
        same = sum(a == b for a, b in zip(res["float32"].texts, res[which].texts, strict=True))
        print(f"  {which:<13} identical completions {same / len(held.examples):.1%}, "
              f"accuracy {res[which].accuracy:.1%}")
    _, note = rollout_dtype("auto", policy.dtype, policy.device)
    print(f"on this machine {note}")


if __name__ == "__main__":
    main()
