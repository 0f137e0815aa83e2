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


def step_prediction(x: torch.Tensor, todo: torch.Tensor, cols: torch.Tensor, tokens: torch.Tensor,
                    conf: torch.Tensor, comp_start: torch.Tensor, width: int):
    """One step's prediction of rows ``x`` / ``todo`` (``[n, T]``, before the step commits), whose block sits at
    columns ``cols`` (``[n, L]``) and predicts ``tokens`` with scores ``conf`` (``[n, L]``): the rows with the
    block's masked slots predicted, which slots are masked, and the predicted slots' scores, read at the completion
    columns ``comp_start + j``, ``j < width`` (``[n, width]`` int32, bool, float32; clamped to the row, so the
    caller masks a column past its row's completion). :class:`StepRecorder` and the engine share it."""
    block = todo.gather(1, cols)
    pred = x.clone().scatter_(1, cols, torch.where(block, tokens, x.gather(1, cols)))
    score = torch.zeros(x.shape, dtype=torch.float32, device=x.device).scatter_(
        1, cols, torch.where(block, conf.float(), 0.0))
    idx = (comp_start[:, None] + torch.arange(width, device=x.device)[None, :]).clamp(max=x.shape[1] - 1)
    return pred.gather(1, idx).int(), todo.gather(1, idx), score.gather(1, idx)


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
        cols = torch.arange(s, e, device=c.x.device)[None, :].expand(len(rows), -1)
        pred, masked, score = step_prediction(c.x[rows], c.todo[rows], cols, tokens, conf, c.comp_start[rows],
                                              c.completion_width)
        inside = (c.comp_start[rows, None] + torch.arange(c.completion_width, device=c.x.device)[None, :]
                  < c.comp_end[rows, None])
        self.entries.append((rows, step.clone(), pred.masked_fill(~inside, 0), masked & inside,
                             score.masked_fill(~inside, 0.0)))

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
