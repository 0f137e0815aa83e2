"""What every rank must do alike under DDP: decisions taken on the largest value over the ranks, metrics averaged
over the ranks, and backward passes of a zero loss (and empty micro-batches) so that every rank joins as many
gradient all-reduces. A one-process run skips every collective."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from accelerate.utils import gather_object

from dllm_rl.training.sharding import backend_name


def max_over_ranks(accelerator, value: int) -> int:
    """The largest ``value`` over all ranks (for decisions every rank must take alike)."""
    if accelerator.num_processes == 1:
        return value
    t = torch.tensor([value], dtype=torch.long, device=accelerator.device)
    return int(accelerator.gather(t).max())


def sum_over_ranks(accelerator, values: list[float]) -> list[float]:
    """Each of ``values`` summed over all ranks (every rank passes as many): the global counts that make a
    loss or a whitening the same at any world size."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    t = torch.tensor([list(map(float, values))], dtype=torch.float64, device=accelerator.device)
    return [float(v) for v in accelerator.gather(t).sum(0)]


def skip_together(accelerator, skip: bool) -> bool:
    """True on every rank when any rank must skip its optimizer step (so the weights stay equal)."""
    return bool(max_over_ranks(accelerator, int(skip)))


def mean_over_ranks(accelerator, m: dict) -> dict:
    """Each metric averaged over the ranks that report a finite value (a rank that kept no sample has
    no loss statistics)."""
    if accelerator.num_processes == 1:
        return m
    rows = gather_object([m])
    out = {}
    for k in sorted({k for r in rows for k in r}):
        vals = [float(r[k]) for r in rows if k in r and math.isfinite(r[k])]
        out[k] = sum(vals) / len(vals) if vals else float("nan")
    return out


def forward_agreement(accelerator) -> Callable[[int], int] | None:
    """Under FSDP2 / ZeRO-3 with several ranks (every forward gathers parameters: a collective), the function
    that turns this rank's number of forwards into the number every rank runs (the largest): the scorer pads
    with one-token forwards up to it (``agree_calls`` of :func:`dllm_rl.estimators.score_rows`). ``None``
    elsewhere (DDP's collectives are in backward only)."""
    if accelerator.num_processes == 1 or backend_name(accelerator) not in ("fsdp2", "zero3"):
        return None
    return lambda n: max_over_ranks(accelerator, n)


def micro_batches(accelerator, n: int, size: int) -> list[list[int]]:
    """Index lists of ``n`` samples in micro-batches of ``size``, padded with empty micro-batches up to the
    most any rank has: every rank runs as many backward passes (so as many gradient all-reduces). The caller
    fills an empty one with the same work at weight 0 (the RL trainer re-scores one of its samples, the value
    model runs a one-token forward)."""
    mbs = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    return mbs + [[] for _ in range(max_over_ranks(accelerator, len(mbs)) - len(mbs))]
