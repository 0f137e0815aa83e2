"""`dllm-rl dpo [CONFIG.yaml] [key=value ...] [--key value ...]`: VRPO preference training of a diffusion LM;
`dllm-rl pairs`: the pairs from a model's own right and wrong answers."""

from __future__ import annotations

import argparse

from dllm_rl.errors import UserError


def dpo(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.dpo.config import DPOConfig
    from dllm_rl.dpo.trainer import train

    result = train(load_command(DPOConfig, args, "configs/demo-dpo.yaml"))
    return 0 if result.step > 0 else 1


def register(sub) -> None:
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument
    from dllm_rl.dpo.config import DPOConfig

    p = sub.add_parser(
        "dpo", help="preference training (VRPO: DPO on stratified ELBOs, LLaDA 1.5)",
        description="Train a diffusion LM on prompt/chosen/rejected pairs with VRPO (arXiv 2505.19223): DPO on "
        "ELBO log-likelihoods with stratified mask counts shared by the policy and the reference.")
    add_command_arguments(p, DPOConfig, words_help="a YAML config (see configs/demo-dpo.yaml), then key=value "
                          "overrides, e.g. beta=0.1 num_mc=8 train.max_steps=50; every key is also a --flag")
    help_config_argument(p, lambda: describe(DPOConfig, defaults=DPOConfig()))
    p.set_defaults(func=dpo)
    add_pairs_parser(sub)


def add_pairs_parser(sub) -> None:
    """``dllm-rl pairs``: pairs of a model's own right and wrong answers (:mod:`~dllm_rl.dpo.pairs`)."""
    from dllm_rl.sampling.cli import add_decode_arguments

    p = sub.add_parser("pairs", help="preference pairs (for dllm-rl dpo) from a model's own right and wrong answers",
                       description="Sample --k completions of each task prompt with the model, score them with the "
                       "task's reward and write prompt/chosen/rejected rows pairing a right answer with a wrong one.")
    p.add_argument("--model", required=True, help="model directory (or hub id) that writes the answers")
    p.add_argument("--task", required=True, help="task name (countdown, gsm8k, ...) whose reward scores the answers")
    p.add_argument("--data", help="the task's data file (default: its file in the shared data folder)")
    p.add_argument("--split", default="train", help="split of a named task (default train)")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--prompt-style", default=None, choices=["chat", "plain", "compact"])
    p.add_argument("--k", type=int, default=8, help="completions sampled per prompt (default 8)")
    p.add_argument("--pairs-per-prompt", type=int, default=1, help="at most this many pairs per prompt (default 1)")
    p.add_argument("--out", required=True, help="output .jsonl file of prompt/chosen/rejected rows")
    p.add_argument("--batch-size", type=int, default=64, help="sequences decoded together (default 64)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_decode_arguments(p)  # --seed: completion j of prompt i is sampled with seed derive_seed(seed, i, j)
    p.set_defaults(func=make_pairs)


def make_pairs(args: argparse.Namespace) -> int:
    from dllm_rl.dpo.pairs import build_pairs, write_pairs
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling.cli import decode_config_from_args
    from dllm_rl.tasks import get_task
    from dllm_rl.training.accel import resolve_device

    if args.k < 2 or args.pairs_per_prompt < 1:
        raise UserError(f"--k {args.k} --pairs-per-prompt {args.pairs_per_prompt}: a pair needs --k >= 2 samples "
                        "per prompt and --pairs-per-prompt >= 1")
    decode = decode_config_from_args(args)
    if decode.temperature == 0:
        raise UserError("--temperature 0 decodes one answer per prompt; sample with --temperature > 0 (e.g. 1)")
    model = load_model(args.model, device=resolve_device(args.device, "--device"))
    tokenizer = load_tokenizer(args.model, mask_token_id=model.mask_token_id, noise=model.family.noise)
    opts = {"split": args.split, "limit": args.limit, **({"data": args.data} if args.data else {}),
            **({"prompt_style": args.prompt_style} if args.prompt_style else {})}
    task = get_task(args.task, **opts)
    try:
        rows, stats = build_pairs(model, tokenizer, task, decode, k=args.k, seed=decode.seed,
                                  per_prompt=args.pairs_per_prompt, batch_size=args.batch_size)
    finally:
        task.close()
    if not rows:
        raise UserError(f"no pairs: {stats.summary()}; sample more (--k) or at a higher --temperature")
    print(f"pairs: {stats.summary()} -> {write_pairs(rows, args.out)}")
    return 0
