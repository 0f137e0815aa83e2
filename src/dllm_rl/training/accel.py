"""`accelerate` set-up shared by the SFT and RL trainers: one script on one CPU or many GPUs."""

from __future__ import annotations

from typing import Literal

import torch
from accelerate import Accelerator

MixedPrecision = Literal["auto", "no", "bf16", "fp16"]


def bf16_supported() -> bool:
    """True when this process's accelerator runs bf16 natively (CUDA with bf16, or XPU)."""
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def resolve_mixed_precision(requested: str = "auto", cpu: bool = False) -> str:
    """``auto`` -> ``bf16`` where the device supports it, else ``no`` (CPU autocast is slower than fp32).

    Explicit ``no`` / ``bf16`` / ``fp16`` are passed through (``accelerate`` validates them).
    """
    if requested not in ("auto", "no", "bf16", "fp16"):
        raise ValueError(f"mixed_precision must be auto | no | bf16 | fp16, got {requested!r}")
    if requested != "auto":
        return requested
    return "bf16" if (not cpu and bf16_supported()) else "no"


def make_accelerator(mixed_precision: str = "auto", cpu: bool = False, **kwargs) -> Accelerator:
    """An :class:`accelerate.Accelerator` with ``mixed_precision`` resolved (see above).

    Gradient accumulation is done by the trainers themselves (``accelerator.no_sync`` on the
    non-final micro-batches), so that one optimizer step is one scheduler step on every world size.
    Extra ``kwargs`` go to ``Accelerator``.
    """
    return Accelerator(mixed_precision=resolve_mixed_precision(mixed_precision, cpu), cpu=cpu, **kwargs)
