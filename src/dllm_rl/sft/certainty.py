"""Certainty-forcing self-distillation, the SFT objective ``certainty_forcing`` (dParallel, Chen, Fang, Ma, Yu and
Wang, arXiv 2509.26488, Sec. 4: "certainty-forcing distillation").

A model decodes in few passes only where it is already sure of many masked tokens at once; dParallel trains it, on
its own trajectories, to become sure sooner. The data are the model's own answers (here: the ones the task's reward
calls right, ``docs/methods.md`` has the two commands), and each answer is noised as its semi-autoregressive
decoding would see it (the paper's semi-autoregressive forward masking, Sec. 4, Eq. 4 in v1):

- one block ``n`` of the answer is drawn uniformly; the blocks before it stay clean (the context), each token of
  block ``n`` is masked with probability ``q`` (``objective.mask_ratio``; 0.5 in the released code), and every
  later block is masked whole;
- ``objective.complement``: a second row masks exactly the tokens of block ``n`` the first left clean (the released
  code's complementary mask), so every token of the block is scored once.

On each row, over the masked tokens ``M`` of block ``n`` (the paper's Eq. 5-8 in v1):

    L_consistency = - (1 / |M|) sum_{i in M} log p(y_i | noisy row)                      (the usual masked CE)
    H_i           = - sum_v p_T(v | noisy row)_i log p_T(v | noisy row)_i,  p_T = softmax(logits / T)
    L_certainty   = (1 / |K|) sum_{i in K} H_i,   K = {i in M : argmax_v p(v)_i = y_i}  (already right)
    L             = L_consistency + beta * L_certainty

summed over the row and its complement, with ``beta`` = ``objective.certainty_weight`` (2 in the released code)
and ``T`` = ``objective.certainty_temperature`` (0.5). The entropy is minimised only where the prediction is
already right, so the model grows sure of what it gets right and is not pushed to commit to its mistakes.
The equation numbers (Eq. 4, Eq. 5-8) are those of the paper's first version as first read and are NOT verified:
checked again were the stored copies of the arXiv abstract and v1 HTML page and third-party summaries, which reach
only the abstract and introduction, not Sec. 4 where the equations stand. The terms are as listed above, and
``tests/sft/test_sft_certainty_forcing.py::test_loss_by_hand`` checks them against a hand computation.

Differences from the released recipe, on purpose: blocks are the model's own attention blocks for block models
(SDAR/TraDo) and ``objective.block_size`` for full attention, counted from the answer's start as the decoder does;
the entropy is computed with ``log_softmax`` (no epsilon). Text models only; logits are projected for the answer
columns of each row (``[rows, answer length, vocabulary]`` at once: no chunking as the estimators do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dllm_rl.config import ConfigError
from dllm_rl.estimators import ScoringBatch
from dllm_rl.estimators.rows import RowRandom
from dllm_rl.models import DiffusionLM
from dllm_rl.models.masks import block_index, position_ids_from_valid


@dataclass
class CertaintyTerms:
    """The objective on one set of masked positions: ``loss = ce + weight * certainty`` and its parts."""

    loss: torch.Tensor
    ce: torch.Tensor
    certainty: torch.Tensor
    masked: int
    correct: int


def certainty_terms(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float, weight: float
                    ) -> CertaintyTerms:
    """The consistency and certainty terms over ``N`` masked positions: ``logits`` ``[N, V]``, ``targets`` ``[N]``
    (see the module docstring). No position: a zero loss that still depends on ``logits``."""
    zero = logits.sum() * 0.0
    if targets.numel() == 0:
        return CertaintyTerms(zero, zero.detach(), zero.detach(), 0, 0)
    logits = logits.float()
    ce = -F.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1).mean()
    correct = logits.argmax(-1) == targets
    if correct.any():
        logq = F.log_softmax(logits[correct] / temperature, dim=-1)
        certainty = -(logq.exp() * logq).sum(-1).mean()
    else:
        certainty = zero
    return CertaintyTerms(ce + weight * certainty, ce, certainty, int(targets.numel()), int(correct.sum()))


def answer_blocks(model: DiffusionLM, batch: ScoringBatch, block_size: int | None) -> torch.Tensor:
    """``[B, G]``: the decoding block of each answer column: the model's attention blocks (block models; positions
    count real tokens from the prompt's start, as the sampler's and the ``block`` estimator's), else blocks of
    ``block_size`` counted from the answer's start (the semi-autoregressive ``block_length``)."""
    if model.is_block_causal:
        bs = model.layout_block(batch.block_size)
        return block_index(position_ids_from_valid(batch.valid()), bs)[:, batch.prompt_len:]
    if block_size is None:
        raise ConfigError("objective.block_size: certainty_forcing on a full-attention model needs the "
                          "semi-autoregressive decoding block (the rollouts' block_length)")
    g = batch.completion_len
    return (torch.arange(g)[None, :] // block_size).expand(batch.batch_size, -1)


def semi_ar_rows(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, block_size: int | None,
                 mask_ratio: float, complement: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The noisy rows of the batch: ``(input_ids [R, P+G], scored [R, G] bool, sample [R])``; ``R = B`` or ``2B``
    with the complement (its rows after the first ``B``)."""
    counted = batch.completion_mask
    blk = answer_blocks(model, batch, block_size).to(counted.device)
    rng = RowRandom(generator, batch)
    big = torch.iinfo(blk.dtype).max
    first = torch.where(counted, blk, big).min(-1).values
    last = torch.where(counted, blk, -1).max(-1).values
    span = (last - first + 1).clamp(min=1)
    pick = rng.rand(1)[:, 0].to(counted.device)
    active_blk = first + (pick * span).long().clamp(max=span - 1)
    in_block = (blk == active_blk[:, None]) & counted
    drawn = rng.rand(batch.completion_len).to(counted.device) < mask_ratio
    masks = [in_block & drawn] + ([in_block & ~drawn] if complement else [])
    future = (blk > active_blk[:, None]) & batch.valid()[:, batch.prompt_len:].to(counted.device)
    clean = batch.input_ids()
    rows, scored = [], []
    for m in masks:
        comp = clean[:, batch.prompt_len:].masked_fill(m | future, model.mask_token_id)
        rows.append(torch.cat([clean[:, :batch.prompt_len], comp], dim=1))
        scored.append(m)
    sample = torch.arange(batch.batch_size).repeat(len(masks))
    return torch.cat(rows), torch.cat(scored), sample


def certainty_forcing(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *,
                      block_size: int | None = None, mask_ratio: float = 0.5, temperature: float = 0.5,
                      weight: float = 2.0, complement: bool = True, **_: object
                      ) -> tuple[torch.Tensor, int, dict[str, float]]:
    """The objective on one micro-batch: ``(loss, scored tokens, metrics)`` (one forward of all rows; the row and its
    complement are reduced separately and summed, as the released code does). Metrics: ``ce``, ``certainty`` and
    ``correct_frac`` (masked tokens whose prediction was already right)."""
    if batch.images is not None:
        raise ConfigError("objective.name=certainty_forcing: text models only; the batch carries images")
    ids, scored, sample = semi_ar_rows(model, batch, generator, block_size=block_size, mask_ratio=mask_ratio,
                                       complement=complement)
    valid = batch.valid()[sample]
    p, g = batch.prompt_len, batch.completion_len
    dev = model.device
    out = model(input_ids=ids.to(dev), attention_mask=valid.to(dev), logits_to_keep=torch.arange(p, p + g))
    targets = batch.completion_ids[sample].to(dev)
    scored = scored.to(dev)
    per = len(sample) // batch.batch_size
    b = batch.batch_size
    parts = [certainty_terms(out.logits[k * b:(k + 1) * b][scored[k * b:(k + 1) * b]],
                             targets[k * b:(k + 1) * b][scored[k * b:(k + 1) * b]],
                             temperature=temperature, weight=weight) for k in range(per)]
    loss = sum((t.loss for t in parts), out.logits.sum() * 0.0)
    masked = sum(t.masked for t in parts)
    metrics = {"ce": float(sum(t.ce.detach() for t in parts)),
               "certainty": float(sum(t.certainty.detach() for t in parts)),
               "correct_frac": sum(t.correct for t in parts) / max(masked, 1)}
    return loss, masked, metrics
