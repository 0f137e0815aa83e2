"""Back-propagating a loss that is linear in the Monte-Carlo draws one draw at a time (BGPO, arXiv 2510.11683).

A loss marked ``linear_in_draws`` (:mod:`dllm_rl.rl.losses`) is a sum of terms that each depend on one draw
of the current policy's scores. Its gradient is then the sum over draws of the gradient of the loss in
which only draw ``d`` is live and every other draw holds the old policy's (detached) scores, so the rows
of one draw are forwarded, back-propagated and freed before the next: the memory of an update does not
grow with the number of draws. The rows are planned once (all randomness first, as everywhere), and the
reported loss and statistics are those of the assembled scores of all draws.
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


def backward_by_draw(
    model: DiffusionLM, estimator: str, batch: ScoringBatch, seed: int, options: dict[str, Any] | None,
    loss_fn: PolicyLoss, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, config: LossConfig,
    scale: float, backward: Callable[[torch.Tensor, bool], None], agree_calls: Callable[[int], int] | None = None,
    all_finite: Callable[[torch.Tensor], bool] = lambda loss: bool(torch.isfinite(loss)),
) -> tuple[LossOutput, TokenScores]:
    """Back-propagate ``scale * loss_fn(...)`` draw by draw (see the module docstring); ``old`` must be the
    old policy's scores of the same rows (same generator ``seed``). ``backward(loss, last)`` is told which
    part is the last (a DeepSpeed engine steps only there). Returns the loss (detached) and statistics of all
    draws together, and the current policy's scores (detached). A draw loss that ``all_finite`` refuses (the
    trainer asks every rank) stops the loop: the returned loss is then non-finite and the caller discards
    the gradients."""
    opts = dict(options or {})
    scorer = {k: opts.pop(k) for k in SCORER_OPTIONS if k in opts}
    rows = plan_rows(model, estimator, batch, torch.Generator(device="cpu").manual_seed(seed), **opts)
    base = old.logp.detach()
    logp = base.clone()
    draws = torch.arange(rows.num_draws, device=base.device)[:, None, None]
    for d in range(rows.num_draws):
        part = score_rows(model, rows_of_draw(rows, d), agree_calls=agree_calls, **scorer)
        mixed = replace(old, logp=torch.where(draws == d, part.logp, base))
        out = policy_objective(loss_fn, mixed, old, ref, advantages, batch.loss_lengths, config)
        if not all_finite(out.loss):
            return LossOutput(torch.full_like(out.loss.detach(), math.nan), out.stats), replace(old, logp=logp)
        backward(out.loss * scale, d == rows.num_draws - 1)
        logp[d] = part.logp[d].detach()
    new = replace(old, logp=logp)
    with torch.no_grad():
        out = policy_objective(loss_fn, new, old, ref, advantages, batch.loss_lengths, config)
    return LossOutput(out.loss.detach(), out.stats), new
