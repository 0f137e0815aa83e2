"""Per-slot KV cache of the continuous-batching engine (block models): each slot keeps the exact keys/values of
its own sequence's committed columns, whatever the other slots hold.

Storage is one zero-initialised pool per layer, ``[slots, H, capacity, D]`` for keys and for values: a slot's
sequence holds columns ``[0, length)`` of its row (its own canvas columns; the canvas of one prompt has no padding,
so column = position). Memory is ``slots x capacity`` whatever the queue, and a finished sequence frees its slot
by being forgotten (the next one overwrites it).

A step forwards sequences whose committed lengths differ, through one ordinary HF cache: :meth:`SlotCache.gather`
copies each sequence's columns right-aligned into a ``[n, H, width + extra, D]`` buffer (``width`` = the longest;
the columns before a shorter row's keys are masked out by the caller's attention bias, and are finite — the pool is
zero-initialised — so masked scores never turn into NaN), and the forward appends its queries in place after
``width``. :meth:`SlotCache.store` then copies the keys of the newly committed columns back into the pool.
"""

from __future__ import annotations

import torch

from dllm_rl.sampling.kv_cache import BufferCache


class SlotCache:
    """Committed keys/values of ``slots`` sequences (see the module docstring)."""

    def __init__(self, slots: int):
        self.slots = slots
        self.keys: list[torch.Tensor] = []  # per layer [slots, H, capacity, D]
        self.values: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def nbytes(self) -> int:
        """Bytes allocated by the pools."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def gather(self, slots: torch.Tensor, lengths: torch.Tensor, extra: int) -> tuple[BufferCache, int]:
        """``(cache, width)``: a :class:`BufferCache` over the sequences in ``slots`` (``[n]``), row ``i`` holding its
        first ``lengths[i]`` columns right-aligned to ``width = max(lengths)``, with room for ``extra`` more
        columns; an empty cache (width 0) when nothing is stored yet."""
        if not self.keys:  # nothing stored yet: the first forward sizes the pools
            return BufferCache(), 0
        width = int(lengths.max())
        cols = torch.arange(width, device=lengths.device)[None, :] - (width - lengths)[:, None]
        cols = cols.clamp(min=0)  # masked columns read the row's column 0: finite, never attended
        buffers = []
        for pool_k, pool_v in zip(self.keys, self.values):
            pair = []
            for pool in (pool_k, pool_v):
                n, heads, dim = len(slots), pool.shape[1], pool.shape[3]
                buf = pool.new_empty((n, heads, width + extra, dim))
                buf[:, :, :width] = pool[slots[:, None], :, cols].permute(0, 2, 1, 3)
                pair.append(buf)
            buffers.append((pair[0], pair[1]))
        return BufferCache.adopted(buffers, width), width

    def store(self, cache: BufferCache, rows: torch.Tensor, slots: torch.Tensor, src: torch.Tensor,
              dst: torch.Tensor, capacity: int) -> None:
        """Copy columns ``src`` of ``cache`` rows ``rows`` to columns ``dst`` of pool ``slots`` (equal-length 1-D
        tensors, one entry per column). The pools are created at the first store (shapes from ``cache``) and grown
        to at least ``capacity`` columns when a column would not fit."""
        if rows.numel() == 0:
            return
        need = max(capacity, int(dst.max()) + 1)
        for li, layer in enumerate(cache.layers):
            for pools, buf in ((self.keys, layer.keys), (self.values, layer.values)):
                if li == len(pools):
                    pools.append(buf.new_zeros((self.slots, buf.shape[1], need, buf.shape[3])))
                elif pools[li].shape[2] < need:
                    grown = pools[li].new_zeros((self.slots, pools[li].shape[1], need, pools[li].shape[3]))
                    grown[:, :, : pools[li].shape[2]] = pools[li]
                    pools[li] = grown
                pools[li][slots, :, dst] = buf[rows, :, src]
