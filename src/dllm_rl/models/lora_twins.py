"""Adapters on tied twin modules share one set of parameters.

DiffusionGemma's encoder and decoder layers are distinct modules over the same (tied) parameters, so peft wraps each
twin with adapters of its own; :func:`tie_lora_twins` makes them one, as transformers ties the base weights. It lives
with the model (not in ``training.lora``, which adds the adapters) because the model's ``tie_weights`` calls it too:
accelerate's FSDP2 preparation moves the model to the meta device, which unties every shared parameter, adapters
included, and then calls the root's ``tie_weights`` (:meth:`~dllm_rl.models.DiffusionLM.tie_weights`).
"""

from __future__ import annotations

import torch


def tie_lora_twins(model: torch.nn.Module) -> int:
    """Make LoRA layers whose base weights are one tied tensor share their adapters too; returns how many were tied.

    DiffusionGemma's encoder and decoder layers are distinct modules over the same (tied) parameters, so peft wraps
    each twin with adapters of its own. Here every adapter tensor (``lora_A`` / ``lora_B``, DoRA's magnitude) of a
    later twin becomes the first twin's Parameter, as transformers ties the base weights: one ``W + (alpha/r) B A``
    for both stacks, one gradient summing both stacks' uses, one optimizer state. Hand-written because peft has no
    notion of tied target modules. Call it after every adapter is added (it is idempotent).
    """
    from peft.tuners.lora import LoraLayer

    first: dict[int, torch.nn.Module] = {}
    tied = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        owner = first.setdefault(id(module.get_base_layer().weight), module)
        if owner is module:
            continue
        for name, param in owner.named_parameters():
            if "lora_" in name and not name.startswith("base_layer."):
                parent, _, leaf = name.rpartition(".")
                setattr(module.get_submodule(parent), leaf, param)
        tied += 1
    return tied
