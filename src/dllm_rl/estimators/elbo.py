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

Block models (``model.is_block_causal``): the block-diffusion ELBO is the sum over blocks of each block's
ELBO given the clean earlier blocks, so every block ``j`` of the completion is its own segment with its own
``L_j``, ``n_j ~ U{1..L_j}`` (stratified across draws as above), subset and weights ``L_j / n_j`` (coupled:
``L_j / (2 n_j)`` and ``L_j / (2 (L_j - n_j))``, or 1 when ``n_j = L_j``); rows run in the two-stream
layout, where a block's scores depend on its own mask only, so the per-block argument above applies to each
term. ``info["num_masked"]`` is then ``sum_j n_j``. Full-attention models have one segment (the formulas
above, unchanged).

The prompt is never masked. Tokens outside ``completion_mask`` (EOS padding after the answer) are never
masked and never scored: they stay as clean context (``mask_uncounted=True`` masks them in every row
instead, still unscored). Samples with ``L = 0`` get no rows and score 0.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, completion_segments, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


def random_subsets(keys: torch.Tensor, counted: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``[..., G]`` bool: the ``n`` counted tokens with the smallest ``keys`` (a uniform ``n``-subset when
    the keys are i.i.d. uniform). ``counted`` broadcasts against ``keys``; ``n`` is ``keys.shape[:-1]``."""
    keys = torch.where(counted, keys, torch.full_like(keys, 2.0))  # uncounted sort last (keys < 1)
    rank = keys.argsort(-1).argsort(-1)
    return (rank < n.unsqueeze(-1)) & counted


def segment_subsets(
    keys: torch.Tensor, counted: torch.Tensor, seg: torch.Tensor, n: torch.Tensor, length: torch.Tensor
) -> torch.Tensor:
    """:func:`random_subsets` inside each segment: ``keys`` ``[B, D, G]`` (uniform float32 draws),
    ``counted``/``seg`` ``[B, G]``, ``n`` ``[B, D, S]`` (the subset size of each segment), ``length`` ``[B, S]``
    (counted tokens per segment). Returns ``[B, D, G]`` bool."""
    s_n = n.shape[-1]
    if s_n == 1:
        return random_subsets(keys, counted[:, None, :], n[..., 0])
    # Sort by (segment, key) with an exact integer key (float32 uniforms are multiples of 2^-24): counted
    # tokens of segment s take ranks start_s .. start_s + L_s - 1; uncounted ones sort last.
    seg_d = seg[:, None, :].expand_as(keys)
    scale = 1 << 24
    sort_key = torch.where(counted[:, None, :], seg_d * scale + (keys * scale).long(), s_n * scale)
    rank = sort_key.argsort(-1).argsort(-1)
    start = (length.cumsum(-1) - length)[:, None, :].expand(-1, keys.shape[1], -1)  # [B, D, S]
    local = rank - start.gather(-1, seg_d)
    return (local < n.gather(-1, seg_d)) & counted[:, None, :]


@register("elbo")
def plan_elbo(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 2,
    coupled: bool = True,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """ESPO's Monte-Carlo ELBO (arXiv 2512.03759, method section: the ELBO as the sequence log-likelihood
    proxy; the "exactly n masked" form is LLaDA's likelihood evaluation, arXiv 2502.09992, inference section).

    ``D = num_mc`` draws; per draw exactly ``n ~ U{1..L}`` (stratified across draws) of the ``L`` counted
    completion tokens are masked with weight ``L/n``; with ``coupled`` their complement is scored in a
    second row and the pair is averaged so that ``sequence_score()`` stays an unbiased ELBO estimate (see
    the module docstring; block models draw ``n_j`` per block). ``info``: ``num_masked`` ``[D, B]`` (``n``, or
    ``sum_j n_j``), ``length`` ``[B]`` (``L``).
    Cost: ``num_mc`` rows per sample, ``2 * num_mc`` with ``coupled`` (minus draws with ``n = L``).
    """
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    seg, s_n = completion_segments(model, batch)  # [B, G]; S = 1 for full attention
    offset = rng.rand(d_n, s_n).to(dev)  # [B, D, S]
    keys = rng.rand(d_n, g_n).to(dev)  # [B, D, G]
    counted = batch.completion_mask
    length = torch.zeros(counted.shape[0], s_n, dtype=torch.long, device=dev)
    length.scatter_add_(1, seg, counted.long())  # [B, S]: L of each segment
    u = (torch.arange(d_n, device=dev, dtype=torch.float32)[None, :, None] + offset) / d_n
    lengths = length[:, None, :].expand(-1, d_n, -1)
    n = torch.minimum(torch.floor(u * lengths).long() + 1, lengths)
    n = torch.where(lengths > 0, n, torch.zeros_like(n))  # [B, D, S]
    subset = segment_subsets(keys, counted, seg, n, length)  # [B, D, G]

    lf, nf = lengths.float(), n.float()
    if coupled:
        full = n == lengths
        w_s = torch.where(full, torch.ones_like(nf), lf / (2 * nf.clamp(min=1)))
        w_c = lf / (2 * (lf - nf).clamp(min=1))
    else:
        w_s = lf / nf.clamp(min=1)
        w_c = torch.zeros_like(nf)
    seg_d = seg[:, None, :].expand(-1, d_n, -1)
    w_s, w_c = w_s.gather(-1, seg_d), w_c.gather(-1, seg_d)  # [B, D, G]: each token's segment weight
    parts = [(subset, w_s)]
    if coupled:
        parts.append((counted[:, None, :] & ~subset, w_c))
    return draw_rows(
        model, batch, parts, d_n, mask_uncounted=mask_uncounted,
        info={"num_masked": n.sum(-1).t().float(), "length": batch.lengths.float()},
    )

