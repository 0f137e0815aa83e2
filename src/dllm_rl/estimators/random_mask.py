"""``random_mask``: MMaDA's UniGRPO random-ratio masking (arXiv 2505.15809).

MMaDA (arXiv 2505.15809), UniGRPO section, "structured noising strategy": for each response a mask ratio
``p_i`` is drawn uniformly from ``[0, 1]`` (defaults ``lo=0, hi=1``), the response tokens are masked with
that ratio (each counted token independently with probability ``t``), the prompt stays clean, and the
per-token log-likelihood is read at the masked positions only (weight 1). The MMaDA schedule of evenly
spaced ratios over the ``mu`` inner iterations is the trainer's business: pass ``mask_ratio=`` to pin ``t``.

With ``importance_weight=True`` masked tokens get weight ``1/t`` — the MDLM / LLaDA pre-training and SFT
loss ``-E_t[(1/t) sum_{masked} log p(y_i | y_t)]`` (LLaDA, arXiv 2502.09992, Eq. 3 / Eq. 5); SFT calls it
with ``lo=eps, hi=1, importance_weight=True``.

Tokens outside ``completion_mask`` stay clean and unscored (``mask_uncounted=True`` masks them).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int, check_unit_interval
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


def mask_ratios(
    rng: RowRandom, d_n: int, lo: float, hi: float, mask_ratio: float | None, device: torch.device
) -> torch.Tensor:
    """``[B, D]`` mask ratios ``t = lo + (hi - lo) * U`` (or the pinned ``mask_ratio``); always drawn so
    that the token draws that follow do not depend on whether the ratio was pinned."""
    u = rng.rand(d_n).to(device)
    if mask_ratio is not None:
        return torch.full_like(u, float(mask_ratio))
    return lo + (hi - lo) * u


def check_ratio_options(lo: float, hi: float, mask_ratio: float | None) -> tuple[float, float]:
    """``(lo, hi)`` as floats in ``[0, 1]`` with ``lo <= hi``; ``mask_ratio`` (if set) in ``[0, 1]``."""
    lo = check_unit_interval("lo", lo)
    hi = check_unit_interval("hi", hi)
    if lo > hi:
        raise ValueError(f"lo must be <= hi, got lo={lo}, hi={hi}")
    if mask_ratio is not None:
        check_unit_interval("mask_ratio", mask_ratio)
    return lo, hi


@register("random_mask")
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
    """MMaDA UniGRPO's random-ratio masking (arXiv 2505.15809, UniGRPO "structured noising strategy"):
    ``t ~ U(lo, hi)`` per sample and draw, each counted token masked with probability ``t``, weight 1 (``1/t``
    with ``importance_weight``, the LLaDA SFT loss weight, arXiv 2502.09992 Eq. 5) on masked tokens.
    ``info["mask_ratio"]``: ``[D, B]``. One row per sample and draw (rows that mask nothing are skipped)."""
    lo, hi = check_ratio_options(lo, hi, mask_ratio)
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    t = mask_ratios(rng, d_n, lo, hi, mask_ratio, dev)  # [B, D]
    r = rng.rand(d_n, g_n).to(dev)  # [B, D, G]
    masked = (r < t[..., None]) & batch.completion_mask[:, None, :]
    w = 1.0 / t.clamp(min=1e-12) if importance_weight else torch.ones_like(t)
    return draw_rows(
        model, batch, [(masked, w[..., None].expand_as(r))], d_n, mask_uncounted=mask_uncounted,
        info={"mask_ratio": t.t()},
    )
