"""``random_mask`` (MMaDA UniGRPO) and ``coupled`` (DiffuCoder coupled-GRPO).

**random_mask** — MMaDA (arXiv 2505.15809), UniGRPO section, "structured noising strategy": for each response a
mask ratio ``p_i`` is drawn uniformly from ``[0, 1]`` (defaults ``lo=0, hi=1``), the response tokens are
masked with that ratio (each counted token independently with probability ``t``), the prompt stays clean,
and the per-token log-likelihood is read at the masked positions only (weight 1). The MMaDA schedule of
evenly spaced ratios over the ``mu`` inner iterations is the trainer's business: pass ``mask_ratio=`` to
pin ``t``. With ``importance_weight=True`` masked tokens get weight ``1/t`` — the MDLM / LLaDA
pre-training and SFT loss ``-E_t[(1/t) sum_{masked} log p(y_i | y_t)]`` (LLaDA, arXiv 2502.09992,
Eq. 3 / Eq. 5); SFT calls it with ``lo=eps, hi=1, importance_weight=True``.

**coupled** — DiffuCoder (arXiv 2506.20639), coupled-GRPO section: per draw one ratio ``t ~ U(lo, hi)``
(``[0.2, 0.8]`` as in the released recipe) and two complementary rows: row 1 masks each counted token
with probability ``t`` (``r < t``), row 2 masks exactly the others, so every counted token is scored
exactly once per pair. Weights follow the released trainer: ``1/t`` on tokens scored in row 1 and
``1/(1-t)`` on tokens scored in row 2 (the per-timestep ELBO weights; ``importance_weight=False`` gives 1).
The released trainer also runs a fully masked row and averages it in,
``logp = (logp_full + w * logp_pair) / 2``: ``full_mask_row=True`` adds that row as an extra draw, so
``token_score()`` (the mean over draws) reproduces that average. The released code draws one ``t`` for the
whole batch; here each sample gets its own ``t`` (same marginal, less correlated across the group).

For both, tokens outside ``completion_mask`` stay clean and unscored (``mask_uncounted=True`` masks them).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.base import (
    MaskedRows,
    RowRandom,
    ScoringBatch,
    TokenScores,
    check_int,
    check_unit_interval,
    draw_rows,
    register,
    score_rows,
)
from dllm_rl.models.diffusion_lm import DiffusionLM


def _ratios(
    rng: RowRandom, d_n: int, lo: float, hi: float, mask_ratio: float | None, device: torch.device
) -> torch.Tensor:
    """``[B, D]`` mask ratios ``t = lo + (hi - lo) * U`` (or the pinned ``mask_ratio``); always drawn so
    that the token draws that follow do not depend on whether the ratio was pinned."""
    u = rng.rand(d_n).to(device)
    if mask_ratio is not None:
        return torch.full_like(u, float(mask_ratio))
    return lo + (hi - lo) * u


def _check_ratio_options(lo: float, hi: float, mask_ratio: float | None) -> tuple[float, float]:
    lo = check_unit_interval("lo", lo)
    hi = check_unit_interval("hi", hi)
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    if mask_ratio is not None:
        check_unit_interval("mask_ratio", mask_ratio)
    return lo, hi


def plan_random_mask(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    lo: float = 0.0,
    hi: float = 1.0,
    importance_weight: bool = False,
    mask_ratio: float | None = None,
    num_mc: int = 1,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """The rows of :func:`random_mask`."""
    lo, hi = _check_ratio_options(lo, hi, mask_ratio)
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    t = _ratios(rng, d_n, lo, hi, mask_ratio, dev)  # [B, D]
    r = rng.rand(d_n, g_n).to(dev)  # [B, D, G]
    masked = (r < t[..., None]) & batch.completion_mask[:, None, :]
    w = 1.0 / t.clamp(min=1e-12) if importance_weight else torch.ones_like(t)
    return draw_rows(
        model, batch, [(masked, w[..., None].expand_as(r))], d_n, mask_uncounted=mask_uncounted,
        info={"mask_ratio": t.t()},
    )


def random_mask(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    lo: float = 0.0,
    hi: float = 1.0,
    importance_weight: bool = False,
    mask_ratio: float | None = None,
    num_mc: int = 1,
    mask_uncounted: bool = False,
    max_rows: int | None = None,
) -> TokenScores:
    """MMaDA UniGRPO's random-ratio masking (arXiv 2505.15809, UniGRPO "structured noising strategy"):
    ``t ~ U(lo, hi)`` per sample and draw, each counted token masked with probability ``t``, weight 1 (``1/t``
    with ``importance_weight``, the LLaDA SFT loss weight) on masked tokens. ``info["mask_ratio"]``:
    ``[D, B]``. One row per sample and draw (rows that mask nothing are skipped)."""
    rows = plan_random_mask(
        model, batch, generator, lo=lo, hi=hi, importance_weight=importance_weight, mask_ratio=mask_ratio,
        num_mc=num_mc, mask_uncounted=mask_uncounted,
    )
    return score_rows(model, rows, max_rows)


def plan_coupled(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    lo: float = 0.2,
    hi: float = 0.8,
    importance_weight: bool = True,
    full_mask_row: bool = False,
    mask_ratio: float | None = None,
    num_mc: int = 1,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """The rows of :func:`coupled`."""
    lo, hi = _check_ratio_options(lo, hi, mask_ratio)
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    t = _ratios(rng, d_n, lo, hi, mask_ratio, dev)  # [B, D]
    r = rng.rand(d_n, g_n).to(dev)
    counted = batch.completion_mask[:, None, :]
    first = (r < t[..., None]) & counted
    second = ~(r < t[..., None]) & counted
    if importance_weight:
        w1, w2 = 1.0 / t.clamp(min=1e-12), 1.0 / (1.0 - t).clamp(min=1e-12)
    else:
        w1, w2 = torch.ones_like(t), torch.ones_like(t)
    parts = [(first, w1[..., None].expand_as(r)), (second, w2[..., None].expand_as(r))]
    first_draws = [0, 0]
    if full_mask_row:  # one extra draw: the whole answer masked, weight 1
        parts.append((counted, torch.ones_like(counted, dtype=torch.float32)))
        first_draws.append(d_n)
    return draw_rows(
        model, batch, parts, d_n + int(full_mask_row), first_draws=first_draws, mask_uncounted=mask_uncounted,
        info={"mask_ratio": t.t()},
    )


def coupled(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    lo: float = 0.2,
    hi: float = 0.8,
    importance_weight: bool = True,
    full_mask_row: bool = False,
    mask_ratio: float | None = None,
    num_mc: int = 1,
    mask_uncounted: bool = False,
    max_rows: int | None = None,
) -> TokenScores:
    """DiffuCoder coupled-GRPO (arXiv 2506.20639, coupled-GRPO, complementary-mask coupled sampling): per draw a
    ratio ``t ~ U(lo, hi)`` and two complementary rows, every counted token scored exactly once per pair
    with weight ``1/t`` (row masked at ratio ``t``) or ``1/(1-t)`` (its complement). ``full_mask_row`` adds
    the released trainer's fully masked row as draw ``D`` (weight 1). ``info["mask_ratio"]``: ``[D, B]``.
    Cost: 2 rows per sample and draw (+1 with ``full_mask_row``)."""
    rows = plan_coupled(
        model, batch, generator, lo=lo, hi=hi, importance_weight=importance_weight, full_mask_row=full_mask_row,
        mask_ratio=mask_ratio, num_mc=num_mc, mask_uncounted=mask_uncounted,
    )
    return score_rows(model, rows, max_rows)


register("random_mask", plan_random_mask)(random_mask)
register("coupled", plan_coupled)(coupled)
