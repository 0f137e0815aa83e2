"""AdamW and learning-rate schedules (warmup + cosine | constant | linear) from one config section."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers.optimization import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from dllm_rl.config import Checked, field

logger = logging.getLogger(__name__)


@dataclass
class OptimConfig(Checked):
    """Optimizer and schedule (the same section in the SFT and RL configs)."""

    lr: float = field(1e-5, gt=0, help="peak learning rate of AdamW (after warmup); outside [1e-9, 1e-2] a warning at "
                      "the start, and a run stops when one update changes the weights' norm beyond x2 or x0.5")
    weight_decay: float = field(
        0.0, ge=0, help="AdamW decoupled weight decay; never applied to norms, biases or 1-D params")
    beta1: float = field(0.9, help="AdamW beta1")
    beta2: float = field(0.999, help="AdamW beta2")
    eps: float = field(1e-8, help="AdamW epsilon")
    scheduler: Literal["cosine", "constant", "linear"] = field(
        "cosine", help="schedule after warmup: cosine decay to min_lr_ratio*lr, constant, or linear decay to 0"
    )
    warmup_steps: int = field(0, ge=0, help="linear warmup from 0 to lr over this many optimizer steps")
    min_lr_ratio: float = field(0.0, ge=0, le=1, help="cosine floor as a fraction of lr")
    max_grad_norm: float | None = field(
        1.0, ge=0, help="clip the global gradient norm to this value (null = no clipping)")


def parameter_groups(params: nn.Module | Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Trainable parameters split into decayed (matrices) and undecayed (norms, biases, other 1-D)."""
    named = params.named_parameters() if isinstance(params, nn.Module) else params
    decay, no_decay, seen = [], [], set()
    for _, p in named:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


#: learning rates AdamW plausibly trains with: published diffusion-LM recipes use 5e-7 to 1e-5 (RL) and up to about
#: 1e-4 (SFT, LoRA), the tiny models of the demos and tests 1e-3 to 3e-2; outside it a run is warned about at start
PLAUSIBLE_LR = (1e-9, 1e-2)


def check_lr(lr: float, key: str = "optim.lr") -> None:
    """Warn (one line naming ``key``) about a learning rate outside :data:`PLAUSIBLE_LR`: above it AdamW moves every
    weight by about the learning rate per step, which wrecks a model in a few steps (the weight check of
    :mod:`dllm_rl.training.finite` then stops the run); below it nothing moves."""
    lo, hi = PLAUSIBLE_LR
    if not lo <= lr <= hi:
        logger.warning("%s=%g is %s AdamW's plausible learning rates [%g, %g]: %s", key, lr,
                       "above" if lr > hi else "below", lo, hi,
                       "each step moves every weight by about that much, which wrecks a model within a few steps "
                       "(published recipes use 1e-6 to 1e-4)" if lr > hi else "the weights will hardly move")


def build_optimizer(model: nn.Module, cfg: OptimConfig, key: str = "optim.lr") -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters (LoRA: only the adapters are trainable); a learning rate outside
    :data:`PLAUSIBLE_LR` is warned about, naming ``key`` (:func:`check_lr`)."""
    groups = parameter_groups(model, cfg.weight_decay)
    if not any(g["params"] for g in groups):
        raise ValueError("build_optimizer: the model has no trainable parameters")
    check_lr(cfg.lr, key)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``cfg.warmup_steps`` then ``cfg.scheduler`` until ``total_steps`` (transformers' schedules).

    Step it once per optimizer step; its ``state_dict`` is saved in checkpoints.
    """
    if total_steps < 1:
        raise ValueError(f"build_scheduler: total_steps must be >= 1, got {total_steps}")
    warm = min(cfg.warmup_steps, total_steps)
    if cfg.scheduler == "constant":
        return get_constant_schedule_with_warmup(optimizer, warm)
    if cfg.scheduler == "linear":
        return get_linear_schedule_with_warmup(optimizer, warm, total_steps)
    if cfg.scheduler == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warm, total_steps, min_lr_rate=cfg.min_lr_ratio)
    raise ValueError(f"unknown scheduler {cfg.scheduler!r}; choose cosine | constant | linear")
