"""`dllm-rl info [MODEL_DIR] [CONFIG.yaml] [key=value ...] [--key value ...]`: what a checkpoint is."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from dllm_rl.config import Checked, field
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.errors import UserError


@dataclass
class InfoConfig(Checked):
    """``dllm-rl info``: the checkpoint (``model.path``, also the bare word) and how to print what it is."""

    #: flags of earlier releases -> their key now (dllm_rl.config.renames)
    RENAMED: ClassVar[dict[str, str]] = {"dtype": "model.dtype"}

    model: ModelSection = field(default_factory=ModelSection, help="the checkpoint (model.tokenizer: where its mask "
                                "token is looked up when config.json names none)")
    json: bool = field(False, help="print one JSON object (numbers as numbers) instead of the table")


def info(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.models.loading import load_model

    cfg = load_command(InfoConfig, args, None, positional="model.path")
    if not cfg.model.path:
        raise UserError("give a checkpoint: dllm-rl info MODEL_DIR (a directory or a hub id org/name[@revision])")
    device = resolve_device(cfg.model.device, "model.device")
    dlm = load_model(cfg.model.path, dtype=resolve_eval_dtype(cfg.model.dtype, device), device=device,
                     tokenizer_dir=cfg.model.tokenizer)
    facts = checkpoint_facts(dlm)
    if cfg.json:
        print(json.dumps(facts))
        return 0
    rows = _rows(facts)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def checkpoint_facts(dlm: Any) -> dict[str, Any]:
    """What ``dllm-rl info`` says about a loaded model, as JSON-ready values (None: not applicable)."""
    from dllm_rl.models.moe import moe_summary

    fam, moe = dlm.family, moe_summary(dlm) or {}
    return {
        "family": fam.name, "attention": fam.attention,
        "block_size": None if fam.attention == "full" else dlm.block_size, "shifted_logits": bool(fam.shift),
        "mask_token_id": dlm.mask_token_id, "eos_token_id": dlm.eos_token_id,
        "eos_token_ids": list(dlm.eos_token_ids), "parameters": dlm.num_parameters(),
        "experts": moe.get("experts"), "experts_per_token": moe.get("experts_per_token"),
        "active_parameters": moe.get("active_parameters"), "dtype": str(dlm.dtype).removeprefix("torch."),
        "layers": dlm.config.num_hidden_layers, "hidden_size": dlm.config.hidden_size,
        "vocab_rows": dlm.config.vocab_size,
    }


def _rows(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The table of :func:`checkpoint_facts`, in words."""
    full = facts["block_size"] is None
    experts = ([("experts", "dense (no experts)")] if facts["experts"] is None else
               [("experts", f"{facts['experts']} per MoE layer, {facts['experts_per_token']} per token"),
                ("active parameters", f"{facts['active_parameters']:,} per token")])
    return [
        ("family", facts["family"]),
        ("attention", "full (bidirectional)" if full else f"block-causal (block_size {facts['block_size']})"),
        ("logits", "shifted by one (position i predicts i+1; adapter aligns)" if facts["shifted_logits"] else
         "same position"),
        ("mask_token_id", facts["mask_token_id"]),
        _eos_row(facts["eos_token_ids"]),
        ("parameters", f"{facts['parameters']:,}"),
        *experts,
        ("dtype", facts["dtype"]),
        ("layers", facts["layers"]),
        ("hidden_size", facts["hidden_size"]),
        ("vocab rows", facts["vocab_rows"]),
    ]


def _eos_row(ids: list[int]) -> tuple[str, Any]:
    """The EOS line: the one id, or every id (config.json's list, generation_config.json's), any of which ends a
    row."""
    if len(ids) == 1:
        return "eos_token_id", ids[0]
    return "eos_token_ids", f"{', '.join(map(str, ids))} (each ends a row; the first is the one appended)"


def register(sub) -> None:
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument

    p = sub.add_parser("info", help="print a checkpoint's family, attention rule, mask id, size and dtype",
                       description="Load a checkpoint and print its family, attention rule, mask and EOS ids, size, "
                       "experts and dtype.")
    add_command_arguments(p, InfoConfig, positional="model.path",
                          words_help="the checkpoint (a directory in a published layout or a hub id "
                          "org/name[@revision]), then key=value overrides, e.g. model.dtype=bfloat16; every key is "
                          "also a --flag")
    help_config_argument(p, lambda: describe(InfoConfig, defaults=InfoConfig()))
    p.set_defaults(func=info)
