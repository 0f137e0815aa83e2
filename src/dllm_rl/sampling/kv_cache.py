"""A transformers ``DynamicCache`` whose layers keep keys/values in a preallocated, geometrically growing
buffer.

Diffusion decoding appends a chunk, reads it, and rolls most of it back at every step. HF's
``DynamicLayer`` appends with ``torch.cat``, which copies the *whole* cache on every forward (O(cache) per
step: for a long rollout this dominates). Here appending writes in place, rolling back only moves the end
marker, and ``keys``/``values`` are views of the live part; the model sees an ordinary ``DynamicCache``.

Its main user is the block KV cache of block diffusion (SDAR, arXiv 2510.06303; TraDo, arXiv 2509.06949):
every finished block is committed once and the speculative block is rolled back after each step
(:mod:`dllm_rl.sampling.runner`, mode ``block``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class BufferLayer(DynamicLayer):
    """One layer's keys/values ``[B, H, capacity, D]``; the first ``length`` columns are live."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self._k = self._v = None
        self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        self.is_initialized = True

    def _publish(self) -> None:
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]

    def _reserve(self, need: int, like_k: torch.Tensor, like_v: torch.Tensor) -> None:
        cap = 0 if self._k is None else self._k.shape[-2]
        if need <= cap and self._k.shape[0] == like_k.shape[0]:
            return
        shape = (*like_k.shape[:-2], max(need, 2 * cap), like_k.shape[-1])
        new_k = like_k.new_empty(shape)
        new_v = like_v.new_empty((*shape[:-1], like_v.shape[-1]))
        if self.length:
            new_k[..., : self.length, :] = self._k[..., : self.length, :]
            new_v[..., : self.length, :] = self._v[..., : self.length, :]
        self._k, self._v = new_k, new_v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self.length, key_states.shape[-2]
        self._reserve(n + add, key_states, value_states)
        self._k[..., n : n + add, :] = key_states
        self._v[..., n : n + add, :] = value_states
        self.length = n + add
        self._publish()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` columns (no copy)."""
        if self.is_initialized:
            self.length = min(self.length, length)
            self._publish()

    def drop_columns(self, s: int, e: int) -> None:
        """Remove columns ``[s, e)`` (shifts the tail left in place)."""
        if not self.is_initialized:
            return
        tail = self.length - e
        if tail > 0:
            self._k[..., s : s + tail, :] = self._k[..., e : self.length, :].clone()
            self._v[..., s : s + tail, :] = self._v[..., e : self.length, :].clone()
        self.length = s + max(tail, 0)
        self._publish()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self.truncate(self.length + tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._publish()

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()


class BufferCache(DynamicCache):
    """A ``DynamicCache`` made of :class:`BufferLayer` s, with column-level ``truncate`` / ``drop_columns``."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=BufferLayer)

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def drop_columns(self, s: int, e: int) -> None:
        for layer in self.layers:
            layer.drop_columns(s, e)
