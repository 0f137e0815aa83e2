"""The engine's image splice: each row's image features written in place into a forward's input embeddings.

A LLaDA-V request's features are made ready once, when it is queued (:func:`request_images`: cast to the model's
dtype and moved to its device, a no-op where they are already so), and each full-attention forward of its prompt
columns writes them straight into the embedding output at its row's columns (:class:`RowSplice`). The generic
:class:`~dllm_rl.models.diffusion_lm.EmbedSplice` instead concatenates every row's features into one tensor, builds
its position mask on the host and scatters into a new embedding tensor: three copies of the features (and one of the
embeddings) per step where the forward needs one write. The write itself stays: a forward without a KV cache embeds
every column, as it embeds the text columns again (with Fast-dLLM's caches only a refresh forwards the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.copies import CopyCounter, nbytes

#: One request's images: ``(prompt offset, features [N, H])`` per image, ready for its forwards.
Spans = tuple[tuple[int, torch.Tensor], ...]


def request_images(images: PromptImages | None, device, dtype: torch.dtype) -> Spans:
    """A one-row :class:`PromptImages`' features as the request's forwards write them (once per request)."""
    if images is None:
        return ()
    return tuple((o, images.features[k].to(device=device, dtype=dtype)) for o, k in images.rows[0])


@dataclass
class RowSplice:
    """A forward's input embeddings ``[rows, width, H]`` carry ``features`` from column ``start`` of row ``row``
    for each ``(row, start, features)`` of ``pieces``, written in place (the engine decodes without gradients)."""

    shape: tuple[int, int]
    pieces: list[tuple[int, int, torch.Tensor]]
    counter: CopyCounter

    @staticmethod
    def of(rows: list[Spans], offsets: list[int], width: int, counter: CopyCounter) -> RowSplice | None:
        """Row ``r``'s images from its prompt's first column ``offsets[r]``; None when no row has one."""
        pieces = [(r, offset + o, f) for r, (spans, offset) in enumerate(zip(rows, offsets)) for o, f in spans]
        return RowSplice((len(rows), width), pieces, counter) if pieces else None

    def apply(self, out: torch.Tensor) -> torch.Tensor:
        if tuple(out.shape[:-1]) != self.shape:
            raise ValueError(f"RowSplice is for input ids of shape {self.shape}, got {tuple(out.shape[:-1])}")
        for r, start, features in self.pieces:
            out[r, start : start + features.shape[0]] = features
            self.counter.add("image", nbytes(features))
        return out
