"""The guard that stops a run whose update wrecked the weights, before they are saved: weights NaN or infinite, or
a weights' norm that exploded or collapsed in one update.

A learning rate far too large leaves NaN / inf weights: an update whose loss was NaN (SFT at ``optim.lr=1e10``:
step 1 throws the weights to ~1e10, step 2's loss and gradients are NaN) or that overflows a weight (a value model
at ``value_model.lr=1e30``); every later loss is NaN too, so without this guard the run skips every step, ends with
exit 0 and saves NaN weights. A finite absurd learning rate wrecks the weights without NaN: AdamW moves every weight
by about the learning rate per step, so ``optim.lr=10`` throws weights of about 0.02 to about 10 and the policy
decodes one token everywhere (an RL run then sees no reward signal and a SFT run ends "successfully" with weights
near the learning rate). So the guard also compares each module's weights' L2 norm after a step's update with the
norm before it, and stops the run when it grew more than :data:`MAX_GROWTH` times or fell below
:data:`MIN_SHRINK` times (e.g. ``optim.lr x optim.weight_decay`` near 1 zeroes the weights). Either needs a relative
update ``||dW|| / ||W||`` above 0.5 in one step (``||W_after|| - ||W_before|| <= ||dW||``), where AdamW at a
learning rate of 1e-5 to 1e-3 gives about 1e-4 to 1e-1 (each weight moves by about the learning rate, the weights'
RMS is about 0.02 and the norm layers' ones add to the norm). Measured on the tests' tiny RL models (first five
steps): the norm changes by x1.001 per step at ``optim.lr=3e-3``, x1.07 at 3e-2 and x1.5 at 0.1; ``optim.lr=10``
grows it x99 in the first update.

The check costs one host sync per step, not one per tensor or per module: each trainable tensor's 2-norm (NaN
exactly when the tensor holds a NaN, since the squares only add), reduced on its device to one NaN flag and one
squared norm per module, the values of all modules (policy, value model) and the norms measured before the update
(kept on the device until then) stacked on one device and read once. An infinite norm (an inf weight, or finite
weights beyond about 1e19, where float32 overflows) is told apart afterwards, with more reads, only in a run being
stopped. (The 2-norm reads each tensor once: for 101M float32 weights on one CPU thread, the norms before and after
and the NaN check together take about 0.2 s per step, where the inf-norm NaN check alone took 0.8 s.) Under FSDP2
each rank measures its own shards, under ZeRO-3 its own partitions, and the values are summed over the ranks (one
collective; replicated weights counted once), so that every rank stops together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


#: the largest factor by which a module's weights' L2 norm may grow in one step's update (see the module docstring)
MAX_GROWTH = 2.0
#: the smallest factor to which it may fall
MIN_SHRINK = 0.5
_CHUNK = 1 << 24  # elements scaled at a time when a norm overflows float32 (the rare path of a wrecked run)


def _sharded(module: torch.nn.Module) -> bool:
    return any(getattr(p, "ds_tensor", None) is not None or hasattr(p, "to_local") for p in module.parameters())


def _square_norm(module: torch.nn.Module) -> torch.Tensor:
    """``[2]`` float32 on the shards' device, no host sync: (1 when this rank's trainable shards hold a NaN, their
    squared L2 norm: inf when one holds an inf, or when the norm overflows float32)."""
    shards = _local_shards(module)  # may be empty on a rank (small FSDP2 shards): it still joins the sum
    device = shards[0].device if shards else torch.device("cpu")
    if not shards:
        return torch.zeros(2, device=device)
    # on the shards' device, no sync per tensor (ZeRO-3 offload may hold some on the CPU); a 2-norm is NaN exactly
    # when its tensor holds a NaN (the squares add, they never cancel), and one read of the tensor, where the
    # inf-norm is several times slower on a CPU
    norms = torch.stack([torch.linalg.vector_norm(t).to(device, torch.float32) for t in shards])
    return torch.stack([torch.isnan(norms).any().float(), norms.square().sum()])


def _holds_inf(module: torch.nn.Module) -> float:
    """1.0 when this rank's trainable shards hold an inf (host syncs per tensor: only on a run being stopped)."""
    return float(any(bool(torch.isinf(t).any()) for t in _local_shards(module)))


def _exact_square_norm(module: torch.nn.Module) -> float:
    """This rank's squared norm of finite weights whose float32 norm overflowed: each tensor scaled by its largest
    magnitude, in chunks (host syncs per tensor: only on a run being stopped)."""
    total = 0.0
    for t in _local_shards(module):
        peak = float(torch.linalg.vector_norm(t, float("inf")))
        if peak > 0:
            flat = t.reshape(-1)
            part = sum(float(torch.linalg.vector_norm(c.float() / peak)) ** 2 for c in flat.split(_CHUNK))
            total += part * peak * peak
    return total


def _measure(accelerator, modules: dict[str, torch.nn.Module], earlier: list[torch.Tensor] | None = None
             ) -> tuple[list[tuple[bool, float]], list[float]]:
    """``(non-finite, squared L2 norm)`` of each module's trainable weights over all ranks, in the order of
    ``modules``, and the squared norms ``earlier`` measured (one per module, still on the device) likewise; one
    host read and, with several ranks, one collective (every rank calls it). An infinite norm (an inf weight, or
    finite weights beyond about 1e19) is told apart after that, on every rank alike."""
    if not modules:
        return [], []
    vals = [_square_norm(m) for m in modules.values()] + [e.reshape(1) for e in earlier or []]
    # the values meet on an accelerator when any is on one (a host-to-device copy does not wait for it)
    device = next((v.device for v in vals if v.device.type != "cpu"), torch.device("cpu"))
    local = torch.cat([v.to(device) for v in vals]).tolist()  # the one host sync
    summed = sum_over_ranks(accelerator, local)
    world = getattr(accelerator, "num_processes", 1)
    share = [1 if _sharded(m) else world for m in modules.values()]  # replicated weights are counted once
    now = [(summed[2 * k] > 0, summed[2 * k + 1] / share[k]) for k in range(len(modules))]
    before = [v / share[k] for k, v in enumerate(summed[2 * len(modules):])]
    if any(not bad and math.isinf(square) for bad, square in now):  # the rare path of a run being stopped
        inf = sum_over_ranks(accelerator, [_holds_inf(m) for m in modules.values()])
        exact = sum_over_ranks(accelerator, [_exact_square_norm(m) if not f else 0.0
                                             for m, f in zip(modules.values(), inf)])
        now = [(bad or f > 0, square if bad or f > 0 else e / n)
               for (bad, square), f, e, n in zip(now, inf, exact, share)]
    return now, before


def nonfinite_weights(accelerator, modules: dict[str, torch.nn.Module | None]) -> list[str]:
    """The names of ``modules`` (None values skipped) that hold a NaN / inf trainable weight on any rank, the
    same list on every rank; one host sync in all (not one per tensor or per module) and, with several ranks, one
    collective (every rank calls it)."""
    present = {k: m for k, m in modules.items() if m is not None}
    return [name for name, (bad, _) in zip(present, _measure(accelerator, present)[0]) if bad]


@dataclass
class Guarded:
    """A module the :class:`WeightGuard` watches: its name in messages, and the learning rate that moves it (its
    config key and value)."""

    module: torch.nn.Module | None
    lr_key: str
    lr: float


class WeightGuard:
    """Stops a run, naming the step, the learning rate and what was measured, when a step's update left NaN / inf
    weights or changed a module's weights' norm by more than :data:`MAX_GROWTH` (or below :data:`MIN_SHRINK`) times.
    One shared check for every trainer: :meth:`before` ahead of a step's optimizer steps, :meth:`check` after
    them (every rank calls both). ``stopping``: how the trainer's message begins (``"sft: stopping"``), ``output``:
    what the stop leaves unwritten (``final/``)."""

    def __init__(self, accelerator, modules: dict[str, Guarded], stopping: str = "stopping", output: str = "final/"):
        self.accelerator, self.stopping, self.output = accelerator, stopping, output
        self.modules = {k: g for k, g in modules.items() if g.module is not None}
        self._before: list[torch.Tensor] | None = None

    def before(self) -> None:
        """Measure the weights' norms before the update (kept on the device: no host sync)."""
        self._before = [_square_norm(g.module)[1] for g in self.modules.values()]

    def problem(self) -> str | None:
        """What the update did wrong, in words (None: nothing); see :meth:`check`."""
        earlier, self._before = self._before, None
        now, before = _measure(self.accelerator, {k: g.module for k, g in self.modules.items()}, earlier)
        bad = [k for k, (nonfinite, _) in zip(self.modules, now) if nonfinite]
        if bad:
            lrs = ", ".join(f"{self.modules[k].lr_key}={self.modules[k].lr:g}" for k in bad)
            return f"the update left NaN/inf weights in the {' and the '.join(bad)} ({lrs})"
        for (name, g), square_before, (_, square) in zip(self.modules.items(), before, now):
            if not 0 < square_before < math.inf:  # all-zero trainable weights (or none): no scale to compare with
                continue
            a, b = math.sqrt(square_before), math.sqrt(square)
            if b > MAX_GROWTH * a or b < MIN_SHRINK * a:
                verb = "grew" if b > a else "fell"
                return (f"the {name}'s weights' norm {verb} from {a:.4g} to {b:.4g} (x{b / a:.2g}) in one update at "
                        f"{g.lr_key}={g.lr:g} (the guard stops a change beyond x{MAX_GROWTH:g} or x{MIN_SHRINK:g})")
        return None

    def check(self, step: int) -> None:
        """Raise :class:`TrainingStopped` naming ``step`` when :meth:`problem` finds one."""
        what = self.problem()
        if what is None:
            return
        keys = " / ".join(dict.fromkeys(g.lr_key for g in self.modules.values() if g.lr_key in what))
        raise TrainingStopped(f"{self.stopping} at step {step}: {what}; {self.output} is not written. Lower the "
                              f"learning rate ({keys}) and start again, or resume from an earlier checkpoint")
