"""Per-slot KV cache of the continuous-batching engine (block models): each slot keeps the exact keys/values of
its own sequence's committed columns, whatever the other slots hold.

Storage is one zero-initialised pool ``[slots, capacity, layers, 2, H, D]`` (keys and values of every layer for
one column side by side, so a step gathers or stores whole columns in one indexing op): a slot's sequence holds
columns ``[0, length)`` of its row (its own canvas columns; the canvas of one prompt has no padding, so column =
position). Memory is ``slots x capacity`` whatever the queue, and a finished sequence frees its slot by being
forgotten (the next one overwrites it).

A step forwards sequences whose committed lengths differ, through one ordinary HF cache: :meth:`SlotCache.gather`
copies each sequence's columns right-aligned into ``[n, H, width + extra, D]`` buffers per layer (``width`` = the
longest; the columns before a shorter row's keys are masked out by the caller's attention bias, and are finite —
the pool is zero-initialised — so masked scores never turn into NaN), and the forward appends its queries in place
after ``width``. :meth:`SlotCache.store` then copies the keys of the newly committed columns back into the pool.
"""

from __future__ import annotations

import torch

from dllm_rl.sampling.kv_cache import BufferCache


class SlotCache:
    """Committed keys/values of ``slots`` sequences (see the module docstring)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.pool: torch.Tensor | None = None  # [slots, capacity, layers, 2, H, D]

    @property
    def capacity(self) -> int:
        return 0 if self.pool is None else self.pool.shape[1]

    def nbytes(self) -> int:
        """Bytes allocated by the pool."""
        return 0 if self.pool is None else self.pool.numel() * self.pool.element_size()

    def gather(self, slots: torch.Tensor, lengths: torch.Tensor, extra: int) -> tuple[BufferCache, int]:
        """``(cache, width)``: a :class:`BufferCache` over the sequences in ``slots`` (``[n]``), row ``i`` holding its
        first ``lengths[i]`` columns right-aligned to ``width = max(lengths)``, with room for ``extra`` more
        columns; an empty cache (width 0) before anything is stored."""
        if self.pool is None:  # nothing stored yet: the first forward sizes the pool
            return BufferCache(), 0
        width = int(lengths.max())
        cols = torch.arange(width, device=lengths.device)[None, :] - (width - lengths)[:, None]
        cols = cols.clamp(min=0)  # masked columns read the row's column 0: finite, never attended
        n, _, layers, _, heads, dim = len(slots), *self.pool.shape[1:]
        buf = self.pool.new_empty((layers, 2, n, heads, width + extra, dim))
        buf[..., :width, :] = self.pool[slots[:, None], cols].permute(2, 3, 0, 4, 1, 5)
        return BufferCache.adopted([(buf[li, 0], buf[li, 1]) for li in range(layers)], width), width

    def store(self, cache: BufferCache, rows: torch.Tensor, slots: torch.Tensor, src: torch.Tensor,
              dst: torch.Tensor, capacity: int) -> None:
        """Copy columns ``src`` of ``cache`` rows ``rows`` to columns ``dst`` of pool ``slots`` (equal-length 1-D
        tensors, one entry per column). The pool is created at the first store (shapes from ``cache``) and grown
        to at least ``capacity`` columns when a column would not fit."""
        if rows.numel() == 0:
            return
        need = max(capacity, int(dst.max()) + 1)
        first = cache.layers[0].keys
        if self.pool is None or self.pool.shape[1] < need:
            grown = first.new_zeros((self.slots, need, len(cache.layers), 2, first.shape[1], first.shape[3]))
            if self.pool is not None:
                grown[:, : self.pool.shape[1]] = self.pool
            self.pool = grown
        cols = torch.stack([torch.stack([layer.keys[rows, :, src], layer.values[rows, :, src]], dim=1)
                            for layer in cache.layers], dim=1)  # [N, layers, 2, H, D]
        self.pool[slots, dst] = cols
