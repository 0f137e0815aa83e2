"""The guard that stops a run whose weights went NaN or infinite, before they are saved.

A learning rate far too large leaves NaN / inf weights: an update whose loss was NaN (SFT at ``optim.lr=1e10``:
step 1 throws the weights to ~1e10, step 2's loss and gradients are NaN) or that overflows a weight (a value model
at ``value_model.lr=1e30``); every later loss is NaN too, so without this guard the run skips every step, ends with
exit 0 and saves NaN weights. (RL skips an update whose loss is NaN, ``max_bad_steps``; AdamW moves a weight by
at most about the learning rate, so ``optim.lr=1e3`` leaves finite weights that no guard here sees.) The check costs one
host sync per step, not one per tensor or per module: each trainable tensor's largest magnitude (the inf-norm, NaN
when the tensor holds a NaN, inf when it holds an inf, finite otherwise: it cannot overflow as a 2-norm can)
reduced on its device to one flag per module, the flags of all modules (policy, value model) stacked on one
device and read once. Under FSDP2 each rank checks its own shards, under ZeRO-3 its own partitions, and the
verdict is agreed over the ranks (one collective), so that every rank stops together.
"""

from __future__ import annotations

import torch

from dllm_rl.errors import UserError
from dllm_rl.training.ranks import sum_over_ranks


class TrainingStopped(UserError):
    """A guard stopped the run (weights or losses NaN / inf, steps without any update); ``final/`` is not
    written, so a broken model is never published as the run's result."""


def _local_shards(module: torch.nn.Module) -> list[torch.Tensor]:
    """This rank's part of every trainable parameter of ``module`` (frozen ones cannot change): the ZeRO-3
    partition (``ds_tensor``), the FSDP2 local shard (``to_local``), else the tensor itself."""
    out = []
    for p in module.parameters():
        if not p.requires_grad:
            continue
        t = getattr(p, "ds_tensor", None)
        if t is None:
            t = p.to_local() if hasattr(p, "to_local") else p
        if t.numel():
            out.append(t.detach())
    return out


def nonfinite_weights(accelerator, modules: dict[str, torch.nn.Module | None]) -> list[str]:
    """The names of ``modules`` (None values skipped) that hold a NaN / inf trainable weight on any rank, the
    same list on every rank; one host sync in all (not one per tensor or per module) and, with several ranks, one
    collective (every rank calls it)."""
    names, flags = [], []
    for name, module in modules.items():
        if module is None:
            continue
        shards = _local_shards(module)  # may be empty on a rank (small FSDP2 shards): it still joins the sum
        device = shards[0].device if shards else torch.device("cpu")
        # on the shards' device, no sync per tensor (ZeRO-3 offload may hold some on the CPU)
        peaks = [torch.linalg.vector_norm(t, float("inf")).to(device, torch.float32) for t in shards]
        names.append(name)
        flags.append(~torch.isfinite(torch.stack(peaks)).all() if peaks else torch.tensor(False))
    if not names:
        return []
    # the flags meet on an accelerator when any is on one (a host-to-device copy does not wait for it)
    device = next((f.device for f in flags if f.device.type != "cpu"), torch.device("cpu"))
    bad = [float(f) for f in torch.stack([f.to(device) for f in flags]).tolist()]  # the one host sync
    return [name for name, n in zip(names, sum_over_ranks(accelerator, bad)) if n > 0]
