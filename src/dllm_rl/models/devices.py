"""Where a model runs and in which dtype: the one resolution of every command's ``model.device`` and
``model.dtype`` (and a reward model's or judge's), below every layer that loads a model. A trainer's process
placement (``training_device``: an index under a launch of several processes) is :mod:`dllm_rl.training.accel`'s."""

from __future__ import annotations

import torch

from dllm_rl.errors import UserError
from dllm_rl.models.loading import resolve_dtype


def available_devices() -> list[str]:
    """The devices this process can use, as torch names them: ``cpu``, each CUDA device, ``mps`` / each XPU."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out += [f"xpu:{i}" for i in range(xpu.device_count())]
    if torch.backends.mps.is_available():
        out.append("mps")
    return out


def resolve_device(device: str, key: str = "device"):
    """The one resolution of a device setting (``model.device``, ``--device``, ...): ``auto`` -> ``cuda`` when
    available, else ``cpu`` (the only fallback); any other value must name a device this machine has, else a
    :class:`~dllm_rl.errors.UserError` naming ``key`` and the devices there are (``cuda:7`` on a machine without
    CUDA used to run on the CPU, recorded as ``cuda:7``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    here = available_devices()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"{key} {device!r}: not a torch device; use auto, cpu, cuda or cuda:N (this machine has: "
                        f"{', '.join(here)})") from None
    if dev.type == "cpu":
        return dev
    same_type = [d for d in here if d.split(":")[0] == dev.type]
    if not same_type:
        raise UserError(f"{key} {device!r}: this machine has no {dev.type} device (it has: {', '.join(here)}); use "
                        f"auto or {here[-1]}")
    if dev.index is not None and f"{dev.type}:{dev.index}" not in same_type:
        raise UserError(f"{key} {device!r}: this machine has {len(same_type)} {dev.type} device(s) "
                        f"({', '.join(same_type)}); use one of them, or auto")
    return dev


def resolve_eval_dtype(dtype: str, device) -> str:
    """``auto`` -> ``bfloat16`` on CUDA, ``float32`` elsewhere; an explicit dtype is checked and kept."""
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    resolve_dtype(dtype)  # validates
    return dtype


__all__ = ["available_devices", "resolve_device", "resolve_eval_dtype"]
