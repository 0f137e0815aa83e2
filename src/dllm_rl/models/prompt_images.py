"""Images in a batch of prompts as data: which prompt positions hold which image's features.

A LLaDA-V prompt row is token ids in which each image occupies a run of positions whose input embeddings are
that image's features (:class:`~dllm_rl.models.diffusion_lm.EmbedSplice`). :class:`PromptImages` says where:
``rows[b]`` lists ``(offset, k)`` pairs, image ``k``'s ``features[k]`` (``[N_k, H]``) filling positions
``offset .. offset + N_k - 1`` of row ``b``'s real prompt tokens (padding not counted). Offsets are relative to
the prompt itself, so the layout survives any left padding: the sampler's canvas, a :class:`Rollout`
(:mod:`dllm_rl.sampling`) and a :class:`~dllm_rl.estimators.ScoringBatch` each place the prompt at their own
columns and ask :meth:`PromptImages.splice` for the splice there.

Each distinct image's features are held once and shared by every row that shows it (a rollout group of G
samples of one prompt points G times at one tensor): the vision tower runs once per distinct image
(:func:`dllm_rl.models.llava_images.prompt_images`), and scoring reuses the rollout's features instead of
recomputing them. Image positions are prompt context: never masked, never scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dllm_rl.models.diffusion_lm import EmbedSplice

Spans = tuple[tuple[int, int], ...]


@dataclass
class PromptImages:
    """``features[k]``: image ``k``'s input embeddings ``[N_k, H]``; ``rows[b]``: ``(offset, k)`` of each image in
    row ``b``'s prompt, by increasing offset (see the module docstring)."""

    features: list[torch.Tensor]
    rows: list[Spans]

    def __len__(self) -> int:
        return len(self.rows)

    @staticmethod
    def none(num_rows: int) -> PromptImages:
        """``num_rows`` prompts without images."""
        return PromptImages([], [() for _ in range(num_rows)])

    def spans(self, b: int) -> list[tuple[int, int]]:
        """``(offset, length)`` of each image run in row ``b``'s prompt."""
        return [(o, int(self.features[k].shape[0])) for o, k in self.rows[b]]

    def select(self, idx) -> PromptImages:
        """Rows ``idx`` (an int, a slice, a list of ints or a 1-D long / bool tensor), in that order; the features
        are shared, not copied."""
        if isinstance(idx, int):
            idx = [idx]
        elif isinstance(idx, slice):
            idx = list(range(len(self)))[idx]
        elif torch.is_tensor(idx):
            idx = (idx.nonzero().flatten() if idx.dtype == torch.bool else idx.flatten()).tolist()
        return PromptImages(self.features, [self.rows[int(i)] for i in idx])

    def row(self, b: int) -> PromptImages:
        """Row ``b`` alone, holding only its own images' features (shared, not copied)."""
        spans = self.rows[b]
        return PromptImages([self.features[k] for _, k in spans], [tuple((o, j) for j, (o, _) in enumerate(spans))])

    @staticmethod
    def cat(parts: Sequence[PromptImages | None], sizes: Sequence[int]) -> PromptImages | None:
        """Rows of ``parts`` in order (``None``: ``sizes[i]`` rows without images); ``None`` if no part has any."""
        if all(p is None for p in parts):
            return None
        features: list[torch.Tensor] = []
        rows: list[Spans] = []
        for part, n in zip(parts, sizes):
            part = part if part is not None else PromptImages.none(n)
            base = len(features)
            features += part.features
            rows += [tuple((o, k + base) for o, k in spans) for spans in part.rows]
        return PromptImages(features, rows)

    def to(self, device) -> PromptImages:
        """The features on ``device`` (``self`` when they are there already)."""
        if all(f.device == torch.device(device) for f in self.features):
            return self
        return PromptImages([f.to(device) for f in self.features], self.rows)

    def check(self, prompt_lengths: Sequence[int], hidden_size: int | None = None) -> None:
        """Raise ``ValueError`` naming the first row whose images do not fit its prompt (one row per prompt,
        runs inside the prompt, increasing and not overlapping) or whose features are not ``[N, hidden_size]``."""
        if len(self) != len(prompt_lengths):
            raise ValueError(f"PromptImages has {len(self)} rows for {len(prompt_lengths)} prompts")
        for k, f in enumerate(self.features):
            if f.dim() != 2 or (hidden_size is not None and f.shape[1] != hidden_size):
                raise ValueError(f"PromptImages.features[{k}] has shape {tuple(f.shape)}; expected [N, {hidden_size}]")
        for b, length in enumerate(prompt_lengths):
            end = 0
            for o, k in self.rows[b]:
                if not 0 <= k < len(self.features):
                    raise ValueError(f"PromptImages row {b}: image {k} does not exist ({len(self.features)} images)")
                n = int(self.features[k].shape[0])
                if o < end or o + n > int(length):
                    raise ValueError(f"PromptImages row {b}: image {k} at offset {o} ({n} positions) overlaps another "
                                     f"or leaves the prompt of {int(length)} tokens")
                end = o + n

    def mask(self, starts: torch.Tensor, width: int, sample: torch.Tensor | None = None) -> torch.Tensor:
        """``[R, width]`` bool: the image positions of rows whose prompt starts at column ``starts[r]``; row ``r``
        shows sample ``sample[r]`` (default ``r``)."""
        return self.splice(starts, width, sample, vectors=False).where

    def splice(self, starts: torch.Tensor, width: int, sample: torch.Tensor | None = None,
               vectors: bool = True) -> EmbedSplice:
        """The :class:`EmbedSplice` of ``[R, width]`` rows whose prompt starts at column ``starts[r]`` and which
        show sample ``sample[r]`` (default ``r``): image features at their prompt columns, nothing elsewhere
        (a completion is never spliced)."""
        starts_l = [int(s) for s in torch.as_tensor(starts).tolist()]
        samples = list(range(len(starts_l))) if sample is None else [int(s) for s in sample.tolist()]
        where = torch.zeros(len(starts_l), width, dtype=torch.bool)
        parts = []
        for r, (b, s0) in enumerate(zip(samples, starts_l)):
            for o, k in self.rows[b]:
                n = int(self.features[k].shape[0])
                where[r, s0 + o : s0 + o + n] = True
                parts.append(self.features[k])
        device = starts.device if torch.is_tensor(starts) else None
        hidden = self.features[0].shape[1] if self.features else 0
        if not vectors:
            vecs = torch.zeros(0, hidden)
        elif parts:
            vecs = torch.cat(parts)
        else:
            vecs = self.features[0][:0] if self.features else torch.zeros(0, hidden)
        return EmbedSplice(where.to(device), vecs)
