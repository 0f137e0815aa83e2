"""`dllm-rl info MODEL_DIR`: what a checkpoint is."""

from __future__ import annotations

import argparse


def info(args: argparse.Namespace) -> int:
    from dllm_rl.models.loading import load_model
    from dllm_rl.models.moe import moe_summary

    dlm = load_model(args.model_dir, dtype=args.dtype)
    fam = dlm.family
    attention = "full (bidirectional)" if fam.attention == "full" else f"block-causal (block_size {dlm.block_size})"
    rows = [
        ("family", fam.name),
        ("attention", attention),
        ("logits", "shifted by one (position i predicts i+1; adapter aligns)" if fam.shift else "same position"),
        ("mask_token_id", dlm.mask_token_id),
        ("eos_token_id", dlm.eos_token_id),
        ("parameters", f"{dlm.num_parameters():,}"),
        *_moe_rows(moe_summary(dlm)),
        ("dtype", str(dlm.dtype).removeprefix("torch.")),
        ("layers", dlm.config.num_hidden_layers),
        ("hidden_size", dlm.config.hidden_size),
        ("vocab rows", dlm.config.vocab_size),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _moe_rows(summary: dict[str, int] | None) -> list[tuple[str, str]]:
    if summary is None:
        return [("experts", "dense (no experts)")]
    return [("experts", f"{summary['experts']} per MoE layer, {summary['experts_per_token']} per token"),
            ("active parameters", f"{summary['active_parameters']:,} per token")]


def register(sub) -> None:
    p = sub.add_parser("info", help="print a checkpoint's family, attention rule, mask id, size and dtype")
    p.add_argument("model_dir", help="checkpoint directory in a published layout (config.json + "
                   "safetensors), or a hub id org/name[@revision]")
    p.add_argument("--dtype", default="float32", help="dtype to load with (float32 | bfloat16)")
    p.set_defaults(func=info)
