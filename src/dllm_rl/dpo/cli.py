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
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument
    from dllm_rl.dpo.pairs import PairsConfig

    p = sub.add_parser("pairs", help="preference pairs (for dllm-rl dpo) from a model's own right and wrong answers",
                       description="Sample k completions of each task prompt with the model, score them with the "
                       "task's reward and write prompt/chosen/rejected rows pairing a right answer with a wrong one.")
    add_command_arguments(p, PairsConfig, words_help="a YAML config (see configs/demo-pairs.yaml), then key=value "
                          "overrides, e.g. model.path=DIR task=countdown out=pairs.jsonl k=8; every key is also a "
                          "--flag")
    help_config_argument(p, lambda: describe(PairsConfig))
    p.set_defaults(func=make_pairs)


def make_pairs(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.dpo.pairs import PairsConfig, build_pairs, write_pairs
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.tasks import get_task

    cfg = load_command(PairsConfig, args, "configs/demo-pairs.yaml")
    if not cfg.model.path:
        raise UserError("model.path: give the model that answers (--model.path DIR or model.path=DIR)")
    device = resolve_device(cfg.model.device, "model.device")
    model = load_model(cfg.model.path, dtype=resolve_eval_dtype(cfg.model.dtype, device), device=device,
                       tokenizer_dir=cfg.model.tokenizer)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path, mask_token_id=model.mask_token_id,
                               noise=model.family.noise)
    opts = {"split": cfg.split, "limit": cfg.limit, **({"data": cfg.data} if cfg.data else {}),
            **({"prompt_style": cfg.prompt_style} if cfg.prompt_style else {})}
    task = get_task(cfg.task, **opts)
    try:
        rows, stats = build_pairs(model, tokenizer, task, cfg.decode, k=cfg.k, seed=cfg.decode.seed,
                                  per_prompt=cfg.pairs_per_prompt, batch_size=cfg.batch_size)
    finally:
        task.close()
    if not rows:
        raise UserError(f"no pairs: {stats.summary()}; sample more (k) or at a higher decode.temperature")
    print(f"pairs: {stats.summary()} -> {write_pairs(rows, cfg.out)}")
    return 0
