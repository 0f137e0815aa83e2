"""Teacher-forced canvases of a uniform-state family (DiffusionGemma), shared by its estimators.

A completion is cut into canvases of the model's ``canvas_length`` ``C`` (the last one filled up with pad). Canvas
``k`` is decoded against the encoder cache of the prompt and the clean canvases ``< k``, exactly as the sampler
(:mod:`dllm_rl.sampling.uniform`) conditions it: the prompt, then each finished canvas, goes through the encoder
once, and every noisy state of canvas ``k`` is a decoder call over that cache (which it reads and never writes).

Columns outside ``completion_mask`` (EOS padding after the answer, right padding, the fill of the last canvas) stay
clean and are never scored, as in the masked ``elbo`` estimator: they keep "where the answer ends" visible.

The estimators call the stock modules directly (as the sampler does: encoder, decoder, LM head), not through the
:class:`~dllm_rl.models.DiffusionLM` forward, which is the masked families' one-sequence call.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from dllm_rl.estimators.batch import ScoringBatch
from dllm_rl.estimators.rows import RowRandom
from dllm_rl.sampling.uniform import CanvasContext


class ModelCanvases:
    """``batch``'s completion as canvases of ``model`` (a DiffusionLM of a uniform-state family, or a wrapper that
    reads through to one). Iterating yields ``(k, clean, counted)`` (``[B, C]`` each) with the encoder cache holding
    the prompt and the clean canvases before ``k``; :meth:`hidden` decodes a noisy state of the current canvas and
    :meth:`head` projects hidden states onto the vocabulary (soft-capped float32 logits, as the stock forward)."""

    def __init__(self, model, batch: ScoringBatch):
        self.hf = model.hf_model
        cfg = self.hf.config
        self.width, self.vocab = int(cfg.canvas_length), int(cfg.get_text_config().vocab_size)
        self.cap = cfg.get_text_config().final_logit_softcapping
        self.batch, self.pad = batch, int(model.pad_token_id)
        self.num = max(1, math.ceil(batch.completion_len / self.width))
        fill = self.num * self.width - batch.completion_len
        self.ids = torch.nn.functional.pad(batch.completion_ids, (0, fill), value=self.pad)
        self.counted = torch.nn.functional.pad(batch.completion_mask, (0, fill), value=False)
        self.ctx: CanvasContext | None = None

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        device = self.hf.device
        self.ctx = CanvasContext(self.hf, self.batch.prompt_ids.to(device), self.batch.prompt_mask.to(device))
        for k in range(self.num):
            if k:
                self.ctx.append(self.ids[:, (k - 1) * self.width: k * self.width].to(device))
            cols = slice(k * self.width, (k + 1) * self.width)
            yield k, self.ids[:, cols].to(device), self.counted[:, cols].to(device)

    def hidden(self, noisy: torch.Tensor, self_conditioning: torch.Tensor | None = None,
               self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.ctx.hidden(noisy, self_conditioning, self_conditioning_mask)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.hf.lm_head(hidden).float()
        return logits if not self.cap else torch.tanh(logits / self.cap) * self.cap

    @property
    def embedding_dtype(self) -> torch.dtype:
        return self.ctx.embedding_dtype


def draw_levels(rng: RowRandom, draws: int, canvases: int, lo: float = 0.0) -> torch.Tensor:
    """``[B, D, K]`` float64 noise levels ``t``, stratified across the ``D`` draws of each canvas as the masked
    ``elbo`` estimator stratifies ``n``: ``u_d = (d + U_d) / D`` with ``U_d ~ U[0, 1)``, then ``t = lo + (1 - lo) u``
    (marginally uniform on ``[lo, 1)``; never 1, where the uniform prior carries no signal)."""
    offset = rng.rand(draws, canvases).double()
    u = (torch.arange(draws, dtype=torch.float64)[None, :, None] + offset.cpu()) / draws
    return lo + (1.0 - lo) * u


def corrupt(clean: torch.Tensor, counted: torch.Tensor, t: torch.Tensor, keys: torch.Tensor,
            noise: torch.Tensor) -> torch.Tensor:
    """``z_t`` of ``clean`` ``[B, C]``: each counted position independently takes the uniform id ``noise`` where its key
    (``U[0, 1)``) is below ``t`` (``[B]``); a drawn id may equal the clean one, so ``q(z_t | x) = Cat(alpha_t x +
    (1 - alpha_t) / V)`` with ``alpha_t = 1 - t``. Uncounted positions stay clean."""
    hit = counted & (keys.to(clean.device) < t.to(clean.device, torch.float32)[:, None])
    return torch.where(hit, noise.to(clean.device), clean)


def chunked(fn, chunk_size: int, *columns: torch.Tensor) -> torch.Tensor:
    """``fn`` over the rows of ``columns`` (``[N, ...]`` each) ``chunk_size`` rows at a time (0: all at once),
    recomputed in backward under grad (:func:`torch.utils.checkpoint.checkpoint`), so only one chunk's ``[chunk, V]``
    logits live at once, as :func:`dllm_rl.models.logprobs.selected_logprobs` does for a selected log-prob."""
    n = columns[0].shape[0]
    step = chunk_size or max(n, 1)
    recompute = torch.is_grad_enabled() and chunk_size > 0
    parts = []
    for start in range(0, n, step):
        part = [c[start: start + step] for c in columns]
        parts.append(checkpoint(fn, *part, use_reentrant=False) if recompute else fn(*part))
    return torch.cat(parts) if parts else columns[0].new_zeros(0, dtype=torch.float32)
