"""What the SFT and RL trainers do differently under a sharded backend (FSDP2, DeepSpeed ZeRO-2/3).

The trainers call these at a handful of places and stay backend-agnostic; under DDP or one process every
helper is a no-op (or the plain path). The design and its measurements are in ``docs/scale-notes.md``:

- :func:`setup_backend` right after the Accelerator is built (before any ``prepare``);
- rollouts, held-out evaluation and the no-grad scoring passes (old policy, reference) run inside
  :func:`dllm_rl.training.sharding.gathered_parameters`: full parameters, no collective per forward, so
  ranks may run different numbers of forwards (sampling that stops early, uneven shards);
- :func:`shard_reference` shards the frozen reference copy like the policy (FSDP2);
- :func:`publishable`: the full weights as a plain model on rank 0, for the published layout.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from accelerate import Accelerator, init_empty_weights

from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM
from dllm_rl.training.lora import ADAPTER_NAME, has_lora
from dllm_rl.training.sharding import (
    add_family_units,
    adopt_launch_backend,
    backend_name,
    full_state_dict,
)
from dllm_rl.training.tied_units import group_tied_units, grouping_tied_units

SHARDED = ("fsdp2", "zero2", "zero3")  # training state (parameters or optimizer states) split over ranks


def _deepspeed(accelerator: Accelerator) -> bool:
    """True under DeepSpeed (any ZeRO stage): the engine, not accelerate, owns backward, clipping and the step."""
    return backend_name(accelerator).startswith("zero")


def is_sharded(accelerator: Accelerator | None) -> bool:
    """True when the optimizer state (and under FSDP2 / ZeRO-3 the parameters) is split over the ranks:
    checkpoints then go through ``accelerator.save_state`` and the final model through :func:`publishable`."""
    return accelerator is not None and backend_name(accelerator) in SHARDED


def setup_backend(accelerator: Accelerator, micro_batch_size: int, max_grad_norm: float | None = None) -> str:
    """Adopt the launcher's FSDP2 / DeepSpeed backend (also on CPU gloo, see
    :func:`~dllm_rl.training.sharding.adopt_launch_backend`) and give DeepSpeed the per-rank micro-batch (the
    trainers prepare no dataloader, where accelerate would read it) and the trainer's clipping
    (``max_grad_norm``; DeepSpeed clips inside its step, accelerate would put 1.0 there). DeepSpeed's own
    accumulation stays 1: the trainers scale each micro-batch's loss themselves and mark the last one of an
    optimizer step with :func:`micro_step` (RL steps have a data-dependent number of micro-batches).
    FSDP2 also wraps the family's own units (:func:`~dllm_rl.training.sharding.add_family_units`: LLaDA-V's
    SigLIP encoder layers and projector). Returns the backend name (``ddp``, ``fsdp2``, ``zero2``, ``zero3``,
    ``single``)."""
    backend = adopt_launch_backend(accelerator)
    if backend == "fsdp1":
        raise UserError("FSDP version 1 is not supported: set fsdp_version: 2 in the accelerate config "
                        "(configs/accelerate/fsdp2.yaml)")
    if backend == "fsdp2":
        add_family_units(accelerator.state.fsdp_plugin)
        group_tied_units(accelerator)
    if backend == "zero3":
        # Models are built whole and partitioned by DeepSpeed at ``prepare``. A ZeRO-3 plugin sets
        # transformers' global DeepSpeed config, under which every model construction runs in
        # ``deepspeed.zero.Init``: parameters partitioned and initialised by DeepSpeed at construction, so the
        # trainers' loading (a stock model filled with renamed tensors), seeded fresh models, LoRA adapters,
        # the value model's copy and the final model's twin would all read or write empty partitions. Unset
        # for the run: each rank holds the full model (in CPU memory on the way) until ``prepare``.
        from transformers.integrations import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    if backend.startswith("zero"):
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = int(micro_batch_size)
        ds["gradient_accumulation_steps"] = 1
        ds["train_batch_size"] = int(micro_batch_size) * accelerator.num_processes
        ds["gradient_clipping"] = float(max_grad_norm or 0.0)
    return backend


def micro_step(accelerator: Accelerator, prepared: torch.nn.Module, last: bool):
    """The context of one micro-batch's forward and backward in an optimizer step of several: DDP skips the
    gradient all-reduce except on the ``last`` (``accelerator.no_sync``); DeepSpeed is told whether this is the
    accumulation boundary (accelerate's ``backward`` hands ``accelerator.sync_gradients`` to
    ``engine.set_gradient_accumulation_boundary`` and steps the engine only there); FSDP2 reduce-scatters every
    backward (accelerate's ``no_sync`` is a no-op for it), which sums the same.

    DDP all-reduces only the gradients of a forward that went through its wrapper; a model whose scorers call its
    modules directly (DiffusionGemma's encoder cache: :mod:`dllm_rl.estimators.canvases`) bypasses it. When the
    ``last`` micro-batch ran no forward with gradient through ``prepared``, the step's accumulated gradients are
    averaged over the ranks here (:func:`average_gradients`), as DDP would."""
    if _deepspeed(accelerator):
        return _deepspeed_boundary(accelerator, bool(last))
    if isinstance(prepared, torch.nn.parallel.DistributedDataParallel):
        return _ddp_micro_step(accelerator, prepared, bool(last))
    return contextlib.nullcontext() if last else accelerator.no_sync(prepared)


@contextlib.contextmanager
def _ddp_micro_step(accelerator: Accelerator, prepared: torch.nn.Module, last: bool):
    through = []  # one entry per forward through the wrapper: whether it recorded a graph (armed DDP's reduction)
    handle = prepared.register_forward_pre_hook(lambda *_: through.append(torch.is_grad_enabled()))
    try:
        with contextlib.nullcontext() if last else accelerator.no_sync(prepared):
            yield
    finally:
        handle.remove()
    if last and not any(through):
        average_gradients(prepared.module, accelerator.device)


BUCKET_BYTES = 1 << 26  # 64 MiB per all-reduce


def average_gradients(module: torch.nn.Module, device: torch.device) -> None:
    """Average ``module``'s gradients over the ranks in place (sum / world, DDP's reduction). A parameter no rank
    has a gradient for (a vision tower in a text run) keeps none, as in one process; one that only some ranks
    have one for (an expert no token of this rank reached) counts zeros on the others. Collective: every rank
    calls it. Hand-written because torch has no public call that all-reduces given gradients (DDP's reducer
    reduces only after its own forward); the gradients go in flat buckets of :data:`BUCKET_BYTES`, one
    ``all_reduce`` each."""
    import torch.distributed as dist

    params = [p for p in module.parameters() if p.requires_grad]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(present)
    grads: dict[tuple, list[torch.Tensor]] = {}
    for param, anywhere in zip(params, present.tolist(), strict=True):
        if anywhere:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grads.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
    world = dist.get_world_size()
    for same in grads.values():
        start = 0
        while start < len(same):
            end, size = start, 0
            while end < len(same) and (end == start or size + same[end].nbytes <= BUCKET_BYTES):
                size += same[end].nbytes
                end += 1
            bucket = same[start:end]
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            flat /= world
            for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(part.view_as(g))
            start = end


@contextlib.contextmanager
def _deepspeed_boundary(accelerator: Accelerator, last: bool):
    accelerator.gradient_state._set_sync_gradients(last)
    try:
        yield
    finally:
        accelerator.gradient_state._set_sync_gradients(True)


def shard_reference(accelerator: Accelerator, reference: DiffusionLM) -> DiffusionLM:
    """Shard the frozen reference copy (``beta > 0``, ``reference: copy``) like the policy, in place.

    FSDP2: accelerate's own ``fsdp2_prepare_model`` (the same units and plugin settings as the policy; not
    registered for ``save_state``: the reference is rebuilt from the start weights). ZeRO-3: an engine of its
    own with the policy's DeepSpeed config less its optimizer and scheduler (``deepspeed.initialize`` without
    an optimizer: partitioned parameters, forward only; not registered with accelerate either). Score with it
    inside ``gathered_parameters(accelerator, reference.model)``. DDP / ZeRO-2: a full frozen copy per rank
    (ZeRO-2 shards optimizer states, not parameters).
    """
    backend = backend_name(accelerator)
    if backend == "fsdp2":
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        with grouping_tied_units(accelerator.state.fsdp_plugin, reference.model):  # as the policy's units
            reference.model = fsdp2_prepare_model(accelerator, reference.model)
    elif backend == "zero3":
        import deepspeed

        config = {k: v for k, v in accelerator.state.deepspeed_plugin.deepspeed_config.items()
                  if k not in ("optimizer", "scheduler")}
        engine, *_ = deepspeed.initialize(model=reference.model, config=config)
        engine.eval()  # (DeepSpeedEngine.eval returns None)
        reference.model = engine
    return reference


def refuse_unsharded_features(accelerator: Accelerator, **features: bool) -> None:
    """Refuse options whose code reads the live parameters as plain tensors (``ema_decay``, a rollout copy)
    under FSDP2 / ZeRO-3, naming the key to change."""
    if backend_name(accelerator) not in ("fsdp2", "zero3"):
        return
    on = [name for name, enabled in features.items() if enabled]
    if on:
        raise UserError(f"{', '.join(on)}: not supported with sharded parameters ({backend_name(accelerator)}); "
                        "turn it off or launch with configs/accelerate/ddp.yaml or zero2.yaml")


def plain_twin(dlm: DiffusionLM, state: dict[str, torch.Tensor]) -> DiffusionLM:
    """A plain, unsharded CPU model of ``dlm``'s architecture (with the same LoRA adapters) holding ``state``
    (a full state dict named like ``dlm.model``). Built on the meta device and filled by assignment, so it
    costs one copy of the weights; the trainers' save paths (merge, adapter, published layout) then run on it.
    """
    lora = has_lora(dlm)
    hf_config = (dlm.model.get_base_model() if lora else dlm.model).config
    with init_empty_weights(include_buffers=False):
        shell = dlm.family.hf_auto_class.from_config(hf_config, attn_implementation=hf_config._attn_implementation)
        if lora:
            from peft import get_peft_model

            shell = get_peft_model(shell, copy.deepcopy(dlm.model.peft_config[ADAPTER_NAME]),
                                   adapter_name=ADAPTER_NAME)
    shell.load_state_dict(state, strict=False, assign=True)
    if bool(hf_config.tie_word_embeddings):
        shell.tie_weights()
    missing = [n for n, p in shell.named_parameters() if p.device.type == "meta"]
    if missing:
        raise RuntimeError(f"plain_twin: the gathered state has no value for {missing[:5]}")
    return dlm.over(shell.eval())


def publishable(accelerator: Accelerator | None, prepared: torch.nn.Module, dlm: DiffusionLM) -> DiffusionLM | None:
    """The model to write in the published layout: ``dlm`` itself unless the backend is sharded; then the
    full weights gathered from ``prepared`` into a :func:`plain_twin` on the main process (None on the
    others). Collective under FSDP2 / ZeRO-3: every rank calls it."""
    if not is_sharded(accelerator):
        return dlm
    state = full_state_dict(accelerator, prepared)
    if isinstance(accelerator.unwrap_model(prepared), DiffusionLM):  # SFT prepares the DiffusionLM itself
        state = {k.removeprefix("model."): v for k, v in state.items()}
    return plain_twin(dlm, state) if accelerator.is_main_process else None


def backward(accelerator: Accelerator, prepared: torch.nn.Module, loss: torch.Tensor, boundary: bool = True) -> None:
    """``accelerator.backward(loss)`` for the prepared model ``prepared``. Under DeepSpeed it goes through that
    model's own engine, which steps at the accumulation boundary that :func:`micro_step` sets: accelerate
    routes every backward to the first engine it prepared, so a second trained model (TraceRL's value model)
    would otherwise back-propagate the policy's loss through the wrong engine. ``boundary=False`` keeps the
    engine from stepping here even in a step's last micro-batch: a loss back-propagated in parts (all but
    the last part), or a step that will be skipped. DDP and FSDP2 need no such flag (their reductions sum)."""
    if _deepspeed(accelerator):
        from accelerate.utils import DeepSpeedEngineWrapper

        DeepSpeedEngineWrapper(prepared).backward(loss, sync_gradients=accelerator.sync_gradients and boundary)
    else:
        accelerator.backward(loss)


def discard_gradients(accelerator: Accelerator, prepared: torch.nn.Module, optimizer) -> None:
    """Drop the gradients accumulated for a skipped optimizer step. DeepSpeed keeps them in its engine's
    optimizer (accelerate's wrapper's ``zero_grad`` does nothing there)."""
    if _deepspeed(accelerator):
        prepared.optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.zero_grad(set_to_none=True)


def clip_gradients(accelerator: Accelerator, prepared: torch.nn.Module, max_norm: float) -> float:
    """Clip ``prepared``'s gradients to ``max_norm``; returns their norm before clipping (nan when unknown).
    Under DeepSpeed the engine has clipped inside its step (``gradient_clipping``, see
    :func:`deepspeed_clipping`) and the norm is that engine's."""
    if _deepspeed(accelerator):
        norm = prepared.get_global_grad_norm()
    else:
        norm = accelerator.clip_grad_norm_(prepared.parameters(), max_norm)
    if norm is None:
        return math.nan
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2: its full value
        norm = norm.full_tensor()
    return float(norm)


@contextlib.contextmanager
def deepspeed_clipping(accelerator: Accelerator, max_norm: float | None):
    """Prepare a second model under DeepSpeed with its own ``gradient_clipping`` (the engine reads it from the
    shared config when it is built); a no-op under other backends."""
    if not _deepspeed(accelerator):
        yield
        return
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    before = ds.get("gradient_clipping")
    ds["gradient_clipping"] = float(max_norm or 0.0)
    try:
        yield
    finally:
        ds["gradient_clipping"] = before
