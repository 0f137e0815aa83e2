"""Per-slot KV cache of the continuous-batching engine (block models, and Fast-dLLM's caches on full-attention
models): each slot keeps the exact keys/values of
its own sequence's columns, whatever the other slots hold, and a step's forward reads them where they lie.

Storage, per layer: keys and values ``[slots, H, capacity, D]``, zero-initialised. Slot ``i`` holds its sequence's
keys at column = position (the canvas of one prompt has no padding). Memory is ``slots x capacity`` whatever the
queue; a finished sequence frees its slot by being forgotten (the next one overwrites it).

A step forwards a group of sequences held in *consecutive* slots (the engine keeps them so), through
:meth:`SlotCache.step_cache`, an ordinary HF cache whose ``update`` writes each layer's new keys (the rows' query
columns) into the pool at their positions and then returns the pool's columns ``[0, width)`` of the group's slots:
a view, so nothing is gathered, copied back or held twice. The columns before a row's current block keep what the
forward wrote (its prompt or just-finished block: the fold of :mod:`~dllm_rl.sampling.runner`'s ``block`` mode);
the current block's are rewritten by the next step's forward. Columns at or after a row's end (the slot's previous
sequence's keys, or zeros) are masked by the caller's attention bias; they are finite, so masked scores never turn
into NaN. What it writes and moves is counted (``counter``, :mod:`~dllm_rl.sampling.copies`). (vLLM's paged
attention reads its cache in place the same way, through block tables and its own kernels; the engine needs no
paging, since a slot's capacity is fixed, and so runs on the model's own attention.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from dllm_rl.sampling.copies import CopyCounter, nbytes


@dataclass
class StepPlan:
    """Where one forward's queries go and what it reads: rows are slots ``first .. first + n - 1``; query
    ``(row, query)`` of each pair in ``write_row`` / ``write_query`` is stored at column ``write_col``; the forward
    attends over columns ``[0, width)``. ``slots`` (``[n]``, any slots) instead makes a write-only forward: it
    stores its queries' keys in those slots and attends over its own keys only (a full-attention refresh of
    Fast-dLLM's caches, which reads nothing cached)."""

    first: int
    n: int
    write_row: torch.Tensor
    write_query: torch.Tensor
    write_col: torch.Tensor
    width: int
    slots: torch.Tensor | None = None


class SlotCache:
    """Keys/values of ``slots`` sequences (see the module docstring)."""

    def __init__(self, slots: int, counter: CopyCounter | None = None):
        self.slots = slots
        self.counter = counter if counter is not None else CopyCounter()  # the bytes it writes and moves
        self.keys: list[torch.Tensor] = []  # per layer [slots, H, capacity, D]
        self.values: list[torch.Tensor] = []
        self._columns = 0  # reserved capacity; the layers are allocated at the first forward (shapes from it)

    @property
    def capacity(self) -> int:
        return self._columns

    def nbytes(self) -> int:
        """Bytes allocated by the pool."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` columns per slot (growing keeps what is stored)."""
        if columns <= self._columns:
            return
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                grown = old.new_zeros((*old.shape[:2], columns, old.shape[3]))
                grown[:, :, : old.shape[2]] = old
                store[i] = grown
                self.counter.add("kv_moved", nbytes(old))
        self._columns = columns

    def move(self, src: int, dst: int, columns: int) -> None:
        """Copy slot ``src``'s first ``columns`` columns to slot ``dst`` (the engine keeps its running sequences in
        consecutive slots)."""
        for t in (*self.keys, *self.values):
            t[dst, :, :columns] = t[src, :, :columns]
            self.counter.add("kv_moved", nbytes(t[dst, :, :columns]))

    def step_cache(self, plan: StepPlan) -> Cache:
        """The HF cache one forward of ``plan`` passes as ``past_key_values``."""
        return _StepCache(self, plan)

    def _update(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor, plan: StepPlan):
        if layer == len(self.keys):  # first forward: allocate this layer from the shapes it brings
            n_heads, dim = key_states.shape[1], key_states.shape[3]
            self.keys.append(key_states.new_zeros((self.slots, n_heads, self._columns, dim)))
            self.values.append(value_states.new_zeros((self.slots, n_heads, self._columns, value_states.shape[3])))
        rows = slice(plan.first, plan.first + plan.n)
        slot = plan.write_row + plan.first if plan.slots is None else plan.slots[plan.write_row]
        out = []
        for store, new in ((self.keys[layer], key_states), (self.values[layer], value_states)):
            written = new[plan.write_row, :, plan.write_query]
            store[slot, :, plan.write_col] = written
            self.counter.add("kv_written", nbytes(written))
            out.append(store[rows, :, : plan.width] if plan.slots is None else new)
        return out[0], out[1]


class _StepLayer(DynamicLayer):
    def __init__(self, owner: _StepCache, index: int):
        super().__init__()
        self.owner, self.index = owner, index

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = self.owner.pool._update(self.index, key_states, value_states, self.owner.plan)
        return self.keys, self.values


class _StepCache(DynamicCache):
    """One forward's view of a :class:`SlotCache` (see :meth:`SlotCache.step_cache`)."""

    def __init__(self, pool: SlotCache, plan: StepPlan):
        self.pool, self.plan = pool, plan
        Cache.__init__(self, layer_class_to_replicate=lambda: _StepLayer(self, len(self.layers)))
