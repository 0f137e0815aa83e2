"""Back-propagating a loss one Monte-Carlo draw at a time, so the memory of an update does not grow with the draws.

A loss marked ``draw_by_draw`` (:mod:`dllm_rl.rl.losses`; BGPO, EBPO) depends on the current policy only through its
per-draw, per-token log-probs ``logp[d]``, and each draw's log-probs come from that draw's own rows. By the chain
rule its gradient is ``sum_d sum_{b,g} (dloss / dlogp[d, b, g]) * grad logp[d, b, g]``, so (as DARE's EBPO actor
does, yjyddq/DARE ``verl/workers/actor/ebpo_actor_mixin.py``):

1. score every draw without a graph (one draw's rows per model call) and compute the loss on those scores held as
   a leaf, which gives the loss and ``G = dloss / dlogp`` (``[D, B, G]``) — the ratio, the clip decision and the
   KL see all draws together, never one draw alone;
2. for each draw ``d``: score its rows with a graph and back-propagate ``sum(logp[d] * G[d])``, then free it.

The gradient is the all-at-once one for *any* loss (not only one linear in the draws); the cost is one graph-free
pass over the rows besides the graphed one (none when the caller hands in the current scores, as on-policy the
old scores are). The rows are planned once (all randomness first, as everywhere).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from dllm_rl.estimators import MaskedRows, ScoringBatch, TokenScores, plan_rows, score_rows
from dllm_rl.estimators.registry import SCORER_OPTIONS
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.rl.losses import LossConfig, LossOutput, PolicyLoss, policy_objective


def rows_of_draw(rows: MaskedRows, d: int) -> MaskedRows:
    """The rows of draw ``d`` (the others dropped)."""
    idx = torch.nonzero(rows.draw == d, as_tuple=True)[0]

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[idx]

    return replace(rows, input_ids=rows.input_ids[idx], valid=rows.valid[idx], draw=rows.draw[idx],
                   sample=rows.sample[idx], weight=rows.weight[idx], clean_ids=pick(rows.clean_ids),
                   prompt_lengths=pick(rows.prompt_lengths))


def loss_gradient(loss_fn: PolicyLoss, current: TokenScores, old: TokenScores, ref: TokenScores | None,
                  advantages: torch.Tensor, lengths: torch.Tensor, config: LossConfig, scale: float,
                  all_finite: Callable[[torch.Tensor], bool]) -> tuple[LossOutput, torch.Tensor | None]:
    """``(loss, G)``: the loss of the graph-free scores ``current`` held as a leaf (detached) and
    ``G = d(scale * loss) / dlogp``, shaped as ``current.logp``; ``G`` is None when ``all_finite`` refuses the loss
    (then the returned loss is NaN). What a loss back-propagated in parts multiplies each part's log-probs by."""
    leaf = current.logp.detach().requires_grad_(True)
    out = policy_objective(loss_fn, replace(current, logp=leaf), old, ref, advantages, lengths, config)
    if not all_finite(out.loss):
        return LossOutput(torch.full_like(out.loss.detach(), math.nan), out.stats), None
    grad = None
    if out.loss.requires_grad:
        (grad,) = torch.autograd.grad(out.loss * scale, leaf, allow_unused=True)
    if grad is None:  # a loss that does not depend on the scores
        grad = torch.zeros_like(leaf)
    return LossOutput(out.loss.detach(), out.stats), grad


def backward_by_draw(
    model: DiffusionLM, estimator: str, batch: ScoringBatch, seed: int, options: dict[str, Any] | None,
    loss_fn: PolicyLoss, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, config: LossConfig,
    scale: float, backward: Callable[[torch.Tensor, bool], None], agree_calls: Callable[[int], int] | None = None,
    all_finite: Callable[[torch.Tensor], bool] = lambda loss: bool(torch.isfinite(loss)),
    current: TokenScores | None = None,
) -> tuple[LossOutput, TokenScores]:
    """Back-propagate ``scale * policy_objective(loss_fn, ...)`` draw by draw (see the module docstring). ``old``
    (and ``ref``) must score the same rows (same generator ``seed``); ``current``: the current policy's scores of
    them when the caller has them (on-policy, ``old`` itself), else they are computed without a graph.
    ``backward(loss, last)`` is told which part is the last (a DeepSpeed engine steps only there). Returns the loss
    (detached) and statistics of all draws together, and the current policy's scores (detached). A loss that
    ``all_finite`` refuses (the trainer asks every rank) is not back-propagated: the returned loss is NaN."""
    opts = dict(options or {})
    scorer = {k: opts.pop(k) for k in SCORER_OPTIONS if k in opts}
    rows = plan_rows(model, estimator, batch, torch.Generator(device="cpu").manual_seed(seed), **opts)
    if current is None:
        with torch.no_grad():
            flat = {**scorer, "max_rows": min(scorer.get("max_rows") or batch.batch_size, batch.batch_size)}
            current = score_rows(model, rows, agree_calls=agree_calls, **flat)
    out, grad = loss_gradient(loss_fn, current, old, ref, advantages, batch.loss_lengths, config, scale, all_finite)
    new = replace(current, logp=current.logp.detach())
    if grad is None:
        return out, new
    for d in range(rows.num_draws):
        part = score_rows(model, rows_of_draw(rows, d), agree_calls=agree_calls, **scorer)
        term = (part.logp[d] * grad[d]).sum()
        if term.requires_grad:  # a draw without rows (every sample empty) has nothing to back-propagate
            backward(term, d == rows.num_draws - 1)
    return out, new
