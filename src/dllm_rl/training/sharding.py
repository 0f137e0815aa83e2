"""What the trainers need from a sharded model, one way per backend (DDP, FSDP2, DeepSpeed ZeRO-2/3).

Used by the trainers through :mod:`dllm_rl.training.backend` (``docs/scale-notes.md`` has the design):

- :func:`adopt_launch_backend`: under ``accelerate launch`` with an FSDP or DeepSpeed config on a machine
  without GPUs, make the CPU (gloo) Accelerator run that backend instead of silently falling back to DDP.
- :func:`gathered_parameters`: a context in which every rank holds the full parameters, so rollouts decode
  with a rank-dependent number of forwards and no collective inside them.
- :func:`full_state_dict`: the full (unsharded) state dict, on rank 0 for saving the published layout or on
  every rank for a rollout copy.
- :func:`add_family_units`: FSDP2 also wraps the module classes a family declares (``Family.fsdp_units``:
  LLaDA-V's SigLIP encoder layers and projector) besides the decoder layers the launch config names;
  :func:`fsdp2_plan` lists the modules that become units.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from accelerate.state import PartialState
from accelerate.utils import DistributedType


def backend_name(accelerator: Accelerator) -> str:
    """``"ddp"``, ``"fsdp2"``, ``"fsdp1"``, ``"zero2"``, ``"zero3"`` (ZeRO stage 0/1 read as ``"zero2"``) or
    ``"single"`` for one process."""
    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return "fsdp2" if accelerator.is_fsdp2 else "fsdp1"
    if kind == DistributedType.DEEPSPEED:
        return "zero3" if accelerator.state.deepspeed_plugin.zero_stage == 3 else "zero2"
    return "single" if accelerator.num_processes == 1 else "ddp"


def adopt_launch_backend(accelerator: Accelerator) -> str:
    """Make a CPU Accelerator use the FSDP / DeepSpeed backend that ``accelerate launch`` configured.

    accelerate 1.15 forms gloo ranks on CPU only with ``Accelerator(cpu=True)`` (MULTI_CPU), and then drops
    an FSDP plugin (it enables FSDP only for GPU-like distributed types) and a DeepSpeed plugin (``and not
    cpu``) without a warning: the model is wrapped in DDP. Hand-written because accelerate has no switch for
    it: this builds the plugin from the launcher's environment exactly as accelerate does on GPUs
    (``FullyShardedDataParallelPlugin()`` / ``DeepSpeedPlugin()`` read ``FSDP_*`` / ``ACCELERATE_DEEPSPEED_*``)
    and sets the distributed type on both of accelerate's shared states, so ``prepare``, ``get_state_dict``,
    ``save_state`` and ``load_state`` take their FSDP2 / DeepSpeed paths on gloo. Call it right after
    building the Accelerator, before any ``prepare``. Returns :func:`backend_name`. A no-op on GPUs and
    without such a launch.
    """
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return backend_name(accelerator)
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        from accelerate.utils import FullyShardedDataParallelPlugin

        accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
        kind = DistributedType.FSDP
    elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        from accelerate.utils import DeepSpeedPlugin  # needs the deepspeed package at prepare time

        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(accelerator.mixed_precision)
        plugin.select(_from_accelerator_state=True)
        accelerator.state.deepspeed_plugins = plugin
        kind = DistributedType.DEEPSPEED
    else:
        return backend_name(accelerator)
    accelerator.state.distributed_type = kind
    PartialState().distributed_type = kind  # prepare() reads this one too
    return backend_name(accelerator)


def _family_units() -> tuple[str, ...]:
    from dllm_rl.models.families import FAMILIES

    return tuple(dict.fromkeys(unit for fam in FAMILIES.values() for unit in fam.fsdp_units))


def _with_family_units(plugin, model: torch.nn.Module) -> None:
    """Extend ``plugin``'s layer classes with the family units that ``model`` holds (as accelerate does for an
    unnamed launch: the model's ``_no_split_modules`` that it instantiates)."""
    from accelerate.utils.dataclasses import get_module_class_from_name

    names = plugin.transformer_cls_names_to_wrap
    if names is None:
        names = [n for n in getattr(model, "_no_split_modules", None) or []
                 if get_module_class_from_name(model, n) is not None]
    extra = [u for u in _family_units() if u not in names and get_module_class_from_name(model, u) is not None]
    plugin.transformer_cls_names_to_wrap = [*names, *extra]


def add_family_units(plugin) -> None:
    """Make FSDP2's transformer-based wrapping also wrap the family units a model holds (once per plugin).

    The launch config names the decoder layer class (``fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer``),
    which for LLaDA-V leaves the SigLIP tower and the projector in the root unit: gathered whole for every
    forward and held for the whole step. A launch config cannot name them in general (accelerate refuses a
    class the model lacks, and one file serves every family), so the classes are added per model, when
    accelerate's ``fsdp2_prepare_model`` asks the plugin for its policy (``set_auto_wrap_policy(model)``, for
    the policy, the reference and the value model alike). Other policies (size-based, none) are left alone.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if getattr(plugin, "_dllm_family_units", False):
        return
    original = plugin.set_auto_wrap_policy

    def set_auto_wrap_policy(model: torch.nn.Module) -> None:
        policy = getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy)
        if policy is transformer_auto_wrap_policy:
            _with_family_units(plugin, model)
        original(model)

    plugin.set_auto_wrap_policy = set_auto_wrap_policy
    plugin._dllm_family_units = True


def fsdp2_plan(plugin, model: torch.nn.Module) -> list[str]:
    """The names of the modules that accelerate's FSDP2 preparation makes units of their own (the root aside),
    computed with accelerate's own policy and without sharding anything."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    plugin.set_auto_wrap_policy(model)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    return [] if policy is None else [name for name, m in model.named_modules() if name and policy(m)]


def _fsdp2_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered_parameters(accelerator: Accelerator, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside, ``model`` (as ``accelerator.prepare`` returned it) runs forwards with full parameters and no
    collective per forward, so ranks may run different numbers of forwards (rollouts that stop early).

    FSDP2: every FSDP unit is all-gathered once (``FSDPModule.unshard``) and kept gathered across forwards
    (``set_reshard_after_forward(False)``), then resharded on exit. ZeRO-3:
    ``deepspeed.zero.GatheredParameters(..., modifier_rank=None)`` (read-only). DDP, ZeRO-2 and one process
    hold full parameters already: nothing happens. Every rank must enter and leave together (the gather and
    the reshard are collectives). Use it under ``torch.no_grad()``; yields ``model``.
    """
    backend = backend_name(accelerator)
    if backend == "fsdp2":
        units = _fsdp2_units(model)
        for unit in units:
            unit.unshard()
            unit.set_reshard_after_forward(False)
        try:
            yield model
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(True)
    elif backend == "zero3":
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            yield model
    elif backend == "fsdp1":
        raise ValueError("gathered_parameters: FSDP version 1 is not supported; set fsdp_version: 2 in the "
                         "accelerate config (configs/accelerate/fsdp2.yaml)")
    else:
        yield model


def full_state_dict(accelerator: Accelerator, model: torch.nn.Module, all_ranks: bool = False
                    ) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict of a prepared ``model``, as CPU tensors named like the unwrapped model.

    Collective under FSDP2 and ZeRO-3: every rank calls it. ``all_ranks=False`` (saving): rank 0 gets the
    tensors, the other ranks may get an empty dict. ``all_ranks=True`` (a rollout copy on each rank): every
    rank gets them. FSDP2 goes through ``torch.distributed.checkpoint.state_dict.get_model_state_dict``
    (``full_state_dict=True``); ZeRO-3 through accelerate's 16-bit gather to rank 0
    (``zero3_save_16bit_model: true`` in the accelerate config), or, for every rank, a state dict read
    inside :func:`gathered_parameters`. DDP / ZeRO-2 hold full weights on every rank already.
    """
    backend = backend_name(accelerator)
    if backend == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)
        state = get_model_state_dict(model, options=options)
    elif backend == "zero3" and all_ranks:
        with gathered_parameters(accelerator, model):
            return _cpu_copy(accelerator.unwrap_model(model).state_dict())
    else:
        state = accelerator.get_state_dict(model) or {}  # ZeRO-3: None on ranks other than 0
    return _cpu_copy(state)


def _cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
