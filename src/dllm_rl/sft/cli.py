"""`dllm-rl sft CONFIG.yaml [key=value ...]`: supervised fine-tuning of a diffusion LM."""

from __future__ import annotations

import argparse


def sft(args: argparse.Namespace) -> int:
    from dllm_rl.config import describe, load_command_config
    from dllm_rl.sft.config import SFTConfig
    from dllm_rl.sft.trainer import train

    if args.help_config:
        print("\n".join(describe(SFTConfig, defaults=SFTConfig())))
        return 0
    cfg = load_command_config(SFTConfig, args.config, args.overrides, "configs/demo-sft.yaml")
    result = train(cfg)
    return 0 if result.step > 0 else 1


def register(sub) -> None:
    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning (random_mask | block | trace | ar | uniform objectives)",
        description="Fine-tune a diffusion LM on prompt/response JSON lines. Objectives: random_mask (MDLM/LLaDA), "
        "block (block diffusion; two-stream for block models), trace (TraceRL trajectory replay), ar, uniform "
        "(uniform-state families such as diffusion_gemma).",
    )
    p.add_argument("config", nargs="?", help="YAML config (see configs/demo-sft.yaml); --help-config lists keys")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=100 optim.lr=3e-4")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and help")
    p.set_defaults(func=sft)
