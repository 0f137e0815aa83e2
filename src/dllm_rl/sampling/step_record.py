"""Recording every decoding step's full prediction, for methods that reward intermediate steps (MDPO, EGSPO).

A masked diffusion model predicts every masked slot at every step; the sampler commits only some. MDPO (He et
al. 2025, arXiv 2508.13148, section 3) rewards the prediction of each step, decoded to text, and trains on the
(state before the step, prediction) pairs: its prediction is the step's sampled tokens (``"sampled"``). EGSPO's
stepwise advantages (arXiv 2603.12554) reward the greedy one-step completion, the argmax of the step's logits
at every masked slot (``"greedy"``). :class:`StepRecorder` keeps, per sequence and step, only token ids and
one score per slot, never logits: ``[B, steps, G]`` int32 tokens, bool mask and float32 confidence, about
``9 * B * steps * G`` bytes (128 sequences x 128 steps x 256 tokens: 38 MB) whatever the vocabulary. The score
is the sampler's confidence in the slot's *sampled* token for both kinds (the score that orders the commits;
MDPO's token weights read it, EGSPO reads none), not the argmax's probability.

The prediction covers the masked slots of the block being decoded; later blocks' slots stay the mask id (the
sampler computes the current block's logits only, and a block model cannot see later blocks). With one block
(MDPO's setting, ``block_length = gen_length``) that is the whole completion.
"""

from __future__ import annotations

import torch

from dllm_rl.sampling.canvas import Canvas

#: what a step's prediction is: its sampled tokens (MDPO) or the argmax of its logits (EGSPO)
PREDICTIONS = ("sampled", "greedy")


class StepRecorder:
    """Collects each step's prediction (``prediction``: one of :data:`PREDICTIONS`) for the rows that took it;
    :meth:`tensors` lays them out per sequence."""

    def __init__(self, canvas: Canvas, prediction: str = "sampled"):
        if prediction not in PREDICTIONS:
            raise ValueError(f"record_steps must be one of {', '.join(PREDICTIONS)}, got {prediction!r}")
        self.canvas = canvas
        self.greedy = prediction == "greedy"
        self.entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, rows: torch.Tensor, step: torch.Tensor, s: int, e: int, tokens: torch.Tensor,
            conf: torch.Tensor) -> None:
        """Rows ``rows`` take their step ``step`` (``[n]``) in block columns ``[s, e)`` with predicted ``tokens``
        (sampled, or the argmax: :attr:`greedy`) and scores ``conf`` (``[n, e - s]``); call before the step commits
        anything."""
        c = self.canvas
        masked = c.todo[rows]
        pred = c.x[rows].clone()
        score = torch.zeros(pred.shape, dtype=torch.float32, device=pred.device)
        block = masked[:, s:e]
        pred[:, s:e] = torch.where(block, tokens, pred[:, s:e])
        score[:, s:e] = torch.where(block, conf.float(), score[:, s:e])
        idx = c.comp_start[rows, None] + torch.arange(c.completion_width, device=pred.device)[None, :]
        inside = idx < c.comp_end[rows, None]
        idx = idx.clamp(max=pred.shape[1] - 1)
        take = lambda t, fill: torch.where(inside, t.gather(1, idx), torch.full_like(idx, fill, dtype=t.dtype))  # noqa: E731
        self.entries.append((rows, step.clone(), take(pred, 0).int(), take(masked, False), take(score, 0.0)))

    def tensors(self, num_rows: int, pad_token_id: int) -> dict[str, torch.Tensor]:
        """``step_tokens`` / ``step_masked`` / ``step_confidence``, ``[B, S, G]`` with ``S`` the most steps of any
        row; a row's steps past its own count hold the pad id, False and 0."""
        c = self.canvas
        width, dev = c.completion_width, c.x.device
        steps = 1 + max((int(step.max()) for _, step, *_ in self.entries if step.numel()), default=-1)
        tokens = torch.full((num_rows, steps, width), pad_token_id, dtype=torch.int32, device=dev)
        masked = torch.zeros((num_rows, steps, width), dtype=torch.bool, device=dev)
        conf = torch.zeros((num_rows, steps, width), dtype=torch.float32, device=dev)
        for rows, step, t, m, f in self.entries:
            tokens[rows, step] = t
            masked[rows, step] = m
            conf[rows, step] = f
        outside = ~c.completion_slots()[:, None, :]
        tokens.masked_fill_(outside, pad_token_id)
        return {"step_tokens": tokens, "step_masked": masked, "step_confidence": conf}
