"""``coupled``: DiffuCoder's coupled-GRPO complementary masks (arXiv 2506.20639).

DiffuCoder (arXiv 2506.20639), coupled-GRPO section: per draw one ratio ``t ~ U(lo, hi)`` (``[0.2, 0.8]`` as
in the released recipe) and two complementary rows: row 1 masks each counted token with probability ``t``
(``r < t``), row 2 masks exactly the others, so every counted token is scored exactly once per pair.
Weights follow the released trainer: ``1/t`` on tokens scored in row 1 and ``1/(1-t)`` on tokens scored in
row 2 (the per-timestep ELBO weights; ``importance_weight=False`` gives 1). The released trainer also runs
a fully masked row and averages it in, ``logp = (logp_full + w * logp_pair) / 2``: ``full_mask_row=True``
adds that row as an extra draw, so ``token_score()`` (the mean over draws) reproduces that average. The
released code draws one ``t`` for the whole batch; here each sample gets its own ``t`` (same marginal, less
correlated across the group).

Tokens outside ``completion_mask`` stay clean and unscored (``mask_uncounted=True`` masks them).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.random_mask import check_ratio_options, mask_ratios
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("coupled")
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
    """DiffuCoder coupled-GRPO (arXiv 2506.20639, coupled-GRPO section, complementary-mask coupled sampling):
    per draw a ratio ``t ~ U(lo, hi)`` and two complementary rows, every counted token scored exactly once per
    pair with weight ``1/t`` (row masked at ratio ``t``) or ``1/(1-t)`` (its complement). ``full_mask_row``
    adds the released trainer's fully masked row as draw ``D`` (weight 1). ``info["mask_ratio"]``: ``[D, B]``.
    Cost: 2 rows per sample and draw (+1 with ``full_mask_row``)."""
    lo, hi = check_ratio_options(lo, hi, mask_ratio)
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    t = mask_ratios(rng, d_n, lo, hi, mask_ratio, dev)  # [B, D]
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
