"""``elbo``: the Monte-Carlo ELBO of ESPO (arXiv 2512.03759), with an optional coupled complement.

ESPO scores a whole completion by the masked-diffusion ELBO (its sequence-level likelihood proxy, in the
"exactly n masked" form LLaDA uses for likelihood evaluation):

    ELBO(y | x) = E_{n ~ U{1..L}} [ (L / n) * E_{S ⊂ counted, |S| = n} sum_{i in S} log p(y_i | x, y with S masked) ]

where ``L`` is the number of counted completion tokens (``completion_mask.sum()``).

Per draw ``d`` (``num_mc`` draws) and sample, ``n`` is *stratified*: ``u_d = (d + U_d) / D`` with
``U_d ~ U[0, 1)`` i.i.d., then ``n = floor(u_d * L) + 1`` — every ``u_d`` is marginally uniform on
``[0, 1)``, so every ``n`` is marginally uniform on ``{1..L}`` while the ``D`` draws cover the range
evenly. ``S`` is a uniformly random ``n``-subset of the counted tokens; they get weight ``L / n``.

Coupled complement (``coupled=True``, the default): the same draw also scores the complement
``S^c`` (the other ``L - n`` counted tokens) in a second row. The pair is averaged:

    n < L:  (1/2) * [ (L/n) sum_{S} log p(.|S masked) + (L/(L-n)) sum_{S^c} log p(.|S^c masked) ]
    n = L:  (L/L) sum_{all} log p(. | all masked)          (no complement row)

i.e. weights ``L/(2n)`` on ``S`` and ``L/(2(L-n))`` on ``S^c``, or 1 when ``n = L``. This is unbiased:
``S^c`` is a uniform subset of size ``m = L - n``, which is uniform on ``{0..L-1}``; writing ``g(m)`` for
the inner expectation at size ``m``, ``E[pair] = (1/L)[g(L) + sum_{n<L} (g(n) + g(L-n))/2]
= (1/L) sum_{m=1..L} g(m) = ELBO``. Every counted token is scored exactly once per coupled draw.

The prompt is never masked. Tokens outside ``completion_mask`` (EOS padding after the answer) are never
masked and never scored: they stay as clean context (``mask_uncounted=True`` masks them in every row
instead, still unscored). Samples with ``L = 0`` get no rows and score 0.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.base import (
    MaskedRows,
    RowRandom,
    ScoringBatch,
    TokenScores,
    build_rows,
    check_int,
    register,
    score_rows,
)
from dllm_rl.models.diffusion_lm import DiffusionLM


def random_subsets(keys: torch.Tensor, counted: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``[..., G]`` bool: the ``n`` counted tokens with the smallest ``keys`` (a uniform ``n``-subset when
    the keys are i.i.d. uniform). ``counted`` broadcasts against ``keys``; ``n`` is ``keys.shape[:-1]``."""
    keys = torch.where(counted, keys, torch.full_like(keys, 2.0))  # uncounted sort last (keys < 1)
    rank = keys.argsort(-1).argsort(-1)
    return (rank < n.unsqueeze(-1)) & counted


def plan_elbo(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 2,
    coupled: bool = True,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """The rows of :func:`elbo` (see the module docstring for the formula and weights)."""
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    b_n, g_n = batch.batch_size, batch.completion_len
    dev = batch.completion_ids.device
    offset = rng.rand(d_n).to(dev)  # [B, D]
    keys = rng.rand(d_n, g_n).to(dev)  # [B, D, G]
    counted = batch.completion_mask
    length = batch.lengths  # [B]
    u = (torch.arange(d_n, device=dev, dtype=torch.float32)[None, :] + offset) / d_n
    n = torch.minimum(torch.floor(u * length[:, None]).long() + 1, length[:, None].expand(-1, d_n))
    n = torch.where(length[:, None] > 0, n, torch.zeros_like(n))  # [B, D]
    subset = random_subsets(keys, counted[:, None, :], n)  # [B, D, G]

    lf = length[:, None].float().expand(-1, d_n)
    nf = n.float()
    if coupled:
        full = n == length[:, None]
        w_s = torch.where(full, torch.ones_like(nf), lf / (2 * nf.clamp(min=1)))
        w_c = lf / (2 * (lf - nf).clamp(min=1))
    else:
        w_s = lf / nf.clamp(min=1)
        w_c = torch.zeros_like(nf)

    # Rows are draw-major: row d * B + b.
    draw = torch.arange(d_n, device=dev).repeat_interleave(b_n)
    sample = torch.arange(b_n, device=dev).repeat(d_n)
    masked_s = subset.transpose(0, 1).reshape(d_n * b_n, g_n)
    weight_s = masked_s * w_s.t().reshape(-1, 1)
    parts_mask, parts_weight, parts_draw, parts_sample = [masked_s], [weight_s], [draw], [sample]
    if coupled:
        comp = (counted[:, None, :] & ~subset).transpose(0, 1).reshape(d_n * b_n, g_n)
        parts_mask.append(comp)
        parts_weight.append(comp * w_c.t().reshape(-1, 1))
        parts_draw.append(draw)
        parts_sample.append(sample)
    masked = torch.cat(parts_mask)
    weight = torch.cat(parts_weight).float()
    keep = masked.any(-1)
    return build_rows(
        batch, torch.cat(parts_sample)[keep], torch.cat(parts_draw)[keep], masked[keep], weight[keep],
        model.mask_token_id, d_n, mask_uncounted=mask_uncounted,
        info={"num_masked": n.t().float(), "length": length.float()},
    )


def elbo(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 2,
    coupled: bool = True,
    mask_uncounted: bool = False,
    max_rows: int | None = None,
) -> TokenScores:
    """ESPO's Monte-Carlo ELBO (arXiv 2512.03759, the sequence-level ELBO likelihood proxy).

    ``D = num_mc`` draws; per draw exactly ``n ~ U{1..L}`` (stratified across draws) of the ``L`` counted
    completion tokens are masked with weight ``L/n``; with ``coupled`` their complement is scored in a
    second row and the pair is averaged so that ``sequence_score()`` stays an unbiased ELBO estimate (see
    the module docstring). ``info``: ``num_masked`` ``[D, B]`` (``n``), ``length`` ``[B]`` (``L``).
    Cost: ``num_mc`` rows per sample, ``2 * num_mc`` with ``coupled`` (minus draws with ``n = L``).
    """
    rows = plan_elbo(model, batch, generator, num_mc=num_mc, coupled=coupled, mask_uncounted=mask_uncounted)
    return score_rows(model, rows, max_rows)


register("elbo", plan_elbo)(elbo)
