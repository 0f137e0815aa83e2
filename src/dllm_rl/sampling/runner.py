"""The model runner: one forward per denoising step, returning the current block's logits, with or
without a KV cache. The decoding loop does not know which cache is in use.

Modes (``Canvas`` columns ``[s, e)`` = current block, ``T`` = width):

* ``none`` (full attention, LLaDA reference ``generate``): forward the whole canvas every step.
* ``prefix`` (Fast-dLLM block-wise approximate KV cache, Wu et al. 2025, arXiv 2505.22618): at the first
  step of a block, forward the whole canvas and keep the keys/values of columns ``< s``; later steps of
  the block forward ``[s, T)`` against them. Approximate: the prefix is not updated as the block fills in.
* ``dual`` (Fast-dLLM dual cache): the first step of a block caches columns ``< s`` and ``>= e`` (the masked
  suffix); later steps forward only ``[s, e)``. Approximate as well (stale prefix and suffix).
  With Dream's shifted logits the block's first column is scored by column ``s - 1``, whose query these later
  steps do not run: they keep the refresh forward's prediction for it. Fast-dLLM's own Dream code instead commits
  that column at every refresh whatever its confidence (and shifts within the block forward, where the column is
  then never masked); we keep one decoding rule with and without a cache, so Dream's tokens under these caches
  differ from that code's. ``tests/sampling/test_sampling_models.py`` checks both caches against a full forward
  given the refresh's keys and values outside the fresh columns.
* ``block`` (SDAR/TraDo block KV cache; SDAR, "A Synergistic Diffusion-AutoRegression Paradigm", arXiv
  2510.06303): the cache holds exactly the committed blocks — never a speculative one. Each step forwards the
  current block against it and the cache is cut back to ``s``. When a block is done its
  keys/values are *not* stored by an extra forward: the first step of the next block forwards
  ``[finished block | new block]`` together (block-causal mask), which stores the finished block's clean
  keys/values and yields the new block's logits in the same pass. Prompt prefill is folded the same way.
  Block-causal attention makes this exact: the tokens equal those of ``block_none``.
* ``block_none``: uncached block-causal reference, forwards columns ``[0, e)`` every step.

The runner sees only the live rows (``set_rows``); finished rows are dropped from the batch and the cache. Within a
block, a live row whose block is already decoded idles until the others finish theirs: the modes without a cache
(``none``, ``block_none``) forward only the rows that still decode (each row's logits depend on its own row alone), so
a threshold-decoded batch costs the sum of its rows' steps rather than its slowest row's steps times the batch; the
cached modes forward every live row, whose caches they hold.
Every forward asks the model for the current block's logits only (``logits_to_keep``): the LM head never
projects the prefix or the masked suffix onto the vocabulary.

A canvas with images (``Canvas.splice``) gives every forward the splice of the columns it runs
(:meth:`~dllm_rl.models.diffusion_lm.EmbedSplice.take`): the image's features enter wherever its prompt columns
are forwarded, and the ``prefix`` / ``dual`` caches hold their keys/values in the prefix like text.
"""

from __future__ import annotations

import torch

from dllm_rl.models import DiffusionLM, attention_bias, block_index
from dllm_rl.sampling.canvas import Canvas
from dllm_rl.sampling.kv_cache import BufferCache

RUNNER_MODES = ("none", "prefix", "dual", "block", "block_none")


class ModelRunner:
    """Computes the current block's logits for the live rows of a :class:`Canvas`."""

    def __init__(self, model: DiffusionLM, canvas: Canvas, mode: str):
        if mode not in RUNNER_MODES:
            raise ValueError(f"unknown runner mode {mode!r}; one of {', '.join(RUNNER_MODES)}")
        if mode.startswith("block") != model.is_block_causal:
            raise ValueError(f"runner mode {mode!r} does not fit a {model.family.name} model")
        self.model, self.canvas, self.mode = model, canvas, mode
        self.blk = block_index(canvas.pos, canvas.block) if model.is_block_causal else None
        self.rows: torch.Tensor | None = None
        self.cache: BufferCache | None = None
        self.cached = 0  # block mode: columns held by the cache (all committed)
        self.prev_raw: torch.Tensor | None = None  # raw logits of column s-1, for shifted (Dream) logits
        self.fresh = True  # prefix/dual: next step refreshes the cache

    def set_rows(self, rows: torch.Tensor) -> None:
        """Restrict to ``rows`` (a subset, in order, of the previous rows); drops the others' cache rows."""
        if self.rows is not None and len(rows) != len(self.rows):
            keep = torch.isin(self.rows, rows).nonzero().flatten()
            if self.cache is not None:
                self.cache.batch_select_indices(keep)
            if self.prev_raw is not None:
                self.prev_raw = self.prev_raw[keep]
        self.rows = rows

    def begin_block(self) -> None:
        if self.mode in ("prefix", "dual"):
            self.fresh, self.cache, self.prev_raw = True, None, None

    def _splice(self, start: int = 0, stop: int | None = None, rows: torch.Tensor | None = None):
        """The image splice of ``rows``' (default: the live rows') columns ``[start, stop)`` (``None``: no image
        there)."""
        splice = self.canvas.splice
        return None if splice is None else splice.take(self.rows if rows is None else rows, start, stop)

    def _forward(self, ids, bias, pos, prev_raw=None, keep=None, start=0, stop=None):
        return self.model(ids, attn_bias=bias, position_ids=pos, past_key_values=self.cache, use_cache=True,
                          prev_raw_logits=prev_raw, logits_to_keep=keep, splice=self._splice(start, stop))

    def _cols(self, s: int, e: int) -> torch.Tensor:
        return torch.arange(s, e, device=self.canvas.x.device)

    @torch.inference_mode()
    def logits(self, s: int, e: int, active: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[n, e - s, V]`` of the current block columns ``[s, e)`` for the live rows selected by ``active``
        (``[rows]`` bool; default all, n = rows)."""
        c, mode = self.canvas, self.mode
        if mode in ("none", "block_none"):  # no cache: forward the decoding rows only
            rows = self.rows if active is None else self.rows[active]
            end, keep = (c.x.shape[1], self._cols(s, e)) if mode == "none" else (e, e - s)
            return self.model(c.x[rows, :end], attention_mask=c.valid[rows, :end], logits_to_keep=keep,
                              splice=self._splice(0, end, rows)).logits
        logits = self._cached_logits(s, e)
        return logits if active is None else logits[active]

    def _cached_logits(self, s: int, e: int) -> torch.Tensor:
        """Logits ``[rows, e - s, V]`` of every live row in the cached modes (``prefix``, ``dual``, ``block``)."""
        c, rows, mode, dtype = self.canvas, self.rows, self.mode, self.model.dtype
        x, valid, pos = c.x[rows], c.valid[rows], c.pos[rows]
        if mode == "block":
            q0, blk = self.cached, self.blk[rows]
            if self.cache is None:
                self.cache = BufferCache()
            bias = attention_bias(valid[:, :e], query_block=blk[:, q0:e], key_block=blk[:, :e], dtype=dtype)
            out = self._forward(x[:, q0:e], bias, pos[:, q0:e], self.prev_raw if q0 == s else None, e - s, q0, e)
            self.cache.truncate(s)
            self.cached = s
            if q0 < s:
                self.prev_raw = out.logits[:, :1]
            return out.logits
        width = x.shape[1]
        if self.fresh:  # prefix / dual: full forward, keep what the rest of the block reuses
            self.cache = BufferCache()
            out = self._forward(x, attention_bias(valid, dtype=dtype), pos, keep=self._cols(s, e))
            self.fresh = False
            self.prev_raw = out.logits[:, :1]  # aligned logits of column s = raw logits of column s - 1
            if mode == "prefix":
                self.cache.truncate(s)
            else:
                self.cache.drop_columns(s, e)
            return out.logits
        if mode == "prefix":
            bias = attention_bias(valid, num_queries=width - s, dtype=dtype)
            out = self._forward(x[:, s:], bias, pos[:, s:], self.prev_raw, keep=self._cols(0, e - s), start=s)
            self.cache.truncate(s)
            return out.logits
        key_valid = torch.cat([valid[:, :s], valid[:, e:], valid[:, s:e]], dim=1)
        out = self._forward(x[:, s:e], attention_bias(key_valid, num_queries=e - s, dtype=dtype), pos[:, s:e],
                            self.prev_raw, start=s, stop=e)
        self.cache.truncate(width - (e - s))
        return out.logits
