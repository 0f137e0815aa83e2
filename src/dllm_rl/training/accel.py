"""`accelerate` set-up shared by the SFT and RL trainers (one script on one CPU or many GPUs), and the device and
dtype a run resolves `auto` to."""

from __future__ import annotations

import gc
import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from dllm_rl.errors import UserError
from dllm_rl.models.devices import resolve_device


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


class PreparedModel:
    """A :class:`~dllm_rl.models.DiffusionLM` seen through ``accelerator.prepare``.

    Calls go through the prepared module (DDP gradient sync, autocast); every other attribute
    (``family``, ``mask_token_id``, ``block_size``, ``device``, ...) reads the unwrapped model, so the
    estimators and objectives take it wherever they take a ``DiffusionLM``. ``.unwrapped`` is the model.
    """

    def __init__(self, prepared: torch.nn.Module, unwrapped: torch.nn.Module):
        self.prepared = prepared
        self.unwrapped = unwrapped

    def __call__(self, *args, **kwargs):
        return self.prepared(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.unwrapped, name)


def prepare_model(accelerator: Accelerator, dlm: torch.nn.Module) -> PreparedModel:
    """``accelerator.prepare(dlm)`` wrapped as a :class:`PreparedModel` (use it for every training forward)."""
    return PreparedModel(accelerator.prepare(dlm), dlm)


def make_accelerator(mixed_precision: str = "auto", cpu: bool = False, timeout_s: float | None = None,
                     **kwargs) -> Accelerator:
    """An :class:`accelerate.Accelerator` with ``mixed_precision`` resolved (see above).

    Gradient accumulation is done by the trainers themselves (``accelerator.no_sync`` on the
    non-final micro-batches), so that one optimizer step is one scheduler step on every world size.
    Extra ``kwargs`` go to ``Accelerator``. On a machine without an accelerator device, ``cpu=True`` is
    implied: that is what makes ``accelerate launch --multi_gpu --num_processes N`` give N real gloo ranks
    on CPU (``accelerate`` only sets up MULTI_CPU when told ``cpu``).

    Faults: ``timeout_s`` bounds every collective (``InitProcessGroupKwargs(timeout=...)``, torch's own
    watchdog); NCCL aborts the process on such a timeout or a peer's error (``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``
    unless set), and under gloo a collective raises as soon as a dead peer's socket closes. The launcher
    (torchrun / ``accelerate launch``) then stops the other ranks and names the failed one.
    """
    cpu = cpu or not _has_device()
    if timeout_s is not None:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        handlers = list(kwargs.pop("kwargs_handlers", None) or [])
        kwargs["kwargs_handlers"] = [*handlers, InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))]
    return Accelerator(mixed_precision=resolve_mixed_precision(mixed_precision, cpu), cpu=cpu, **kwargs)


def end_distributed() -> None:
    """Destroy the default process group, if one was formed, after the run's models are freed.

    Left to interpreter exit, a gloo group can deadlock the process: freeing the last DDP model frees the group,
    whose destructor joins its worker threads while holding the GIL, and a worker still freeing its last
    collective's work needs the GIL (measured: rank 0 of a 2-rank run never exited after its final all-reduce,
    its main thread in ``~ProcessGroupGloo`` and a worker waiting for the GIL). Collecting the models first
    leaves the group's last reference to ``destroy_process_group``, which drops it without the GIL.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()


def _has_device() -> bool:
    if torch.cuda.is_available():
        return True
    for name in ("xpu", "mps", "npu"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        if backend is not None and hasattr(backend, "is_available") and backend.is_available():
            return True
    return False


def training_device(device: str, key: str) -> bool:
    """Resolve a trainer's device setting (:func:`resolve_device`) before its accelerator is made; returns whether
    it runs on the CPU (accelerate then forms gloo ranks under ``accelerate launch --multi_gpu``). A single
    process honours a device index (``cuda:1``: that GPU becomes the current one, which accelerate's ``cuda``
    means); under a launch of several processes each takes its own GPU, so an index is refused."""
    dev = resolve_device(device, key)
    if dev.type != "cpu" and dev.index is not None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            raise UserError(f"{key} {device!r}: each of the {world} launched processes uses its own device "
                            f"({dev.type}:LOCAL_RANK); set {key}={dev.type} or auto")
        torch.get_device_module(dev.type).set_device(dev.index)
    return dev.type == "cpu"
