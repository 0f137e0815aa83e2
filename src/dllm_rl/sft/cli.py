"""`dllm-rl sft [CONFIG.yaml] [key=value ...] [--key value ...]`: supervised fine-tuning of a diffusion LM."""

from __future__ import annotations

import argparse


def sft(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.sft.config import SFTConfig
    from dllm_rl.sft.trainer import train

    cfg = load_command(SFTConfig, args, "configs/demo-sft.yaml")
    result = train(cfg)
    return 0 if result.step > 0 else 1


def register(sub) -> None:
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument
    from dllm_rl.sft.config import SFTConfig

    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning (random_mask | block | trace | ar | uniform objectives)",
        description="Fine-tune a diffusion LM on prompt/response JSON lines. Objectives: random_mask (MDLM/LLaDA), "
        "block (block diffusion; two-stream for block models), trace (TraceRL trajectory replay), ar, uniform "
        "(uniform-state families such as diffusion_gemma).",
    )
    add_command_arguments(p, SFTConfig, words_help="a YAML config (see configs/demo-sft.yaml), then key=value "
                          "overrides, e.g. train.max_steps=100 optim.lr=3e-4; every key is also a --flag")
    help_config_argument(p, lambda: describe(SFTConfig, defaults=SFTConfig()))
    p.set_defaults(func=sft)
