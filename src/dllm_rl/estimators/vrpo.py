"""``vrpo``: the stratified ELBO of VRPO (LLaDA 1.5, arXiv 2505.19223), the log-likelihood of ``dllm-rl dpo``.

VRPO's variance reductions of the ELBO estimate ``B(y)`` that DPO puts in place of ``log p(y)`` (paper, method
section "Variance-Reduced Preference Optimization"):

1. a budget of ``n`` Monte-Carlo rows per sequence;
2. *optimal allocation*: ``n`` mask counts (timesteps) with one mask each;
3. *antithetic sampling*: the policy and the reference score the **same** masked copies of ``y``. Here that is
   the caller's business and free: planners draw from the caller's generator and the batch's ``sample_seeds``
   only, so two identically seeded calls (policy, reference) mask alike; chosen and rejected are different
   samples (own seeds), masked independently.

The counts are stratified by one random offset (the official code is closed; this follows the published
re-implementation, DARE ``_forward_process_vrpo``, which mirrors LLaDA's likelihood evaluation). For a response of
``L`` counted tokens and ``n = num_mc`` rows:

    k ~ U{1..L};   x_j = round(k + j * L / n)  (half to even),   x_j <- ((x_j - 1) mod L) + 1,   j = 0..n-1

Row ``j`` masks a uniformly random ``x_j``-subset of the counted tokens with weight ``L / x_j`` on each
(``sequence_score()`` = ``(1/n) sum_j (L/x_j) sum_{masked} log p`` is then the ELBO estimate, unbiased since
each ``x_j`` is marginally uniform on ``{1..L}``). Every row masks at least one token. Example ``L = 10, n = 4,
k = 5``: ``x = [5, 8, 10, 2]``, weights ``[2, 1.25, 1, 5]``.

Block models (``model.is_block_causal``): the block-diffusion ELBO is a sum over blocks (BD3-LM arXiv 2503.09573
Eq. 8), so each block of the completion is its own segment with its own ``L_j``, offset ``k_j`` and comb of counts,
scored in the two-stream layout (as :mod:`~dllm_rl.estimators.elbo` does). The prompt is never masked; tokens
outside ``completion_mask`` stay clean and unscored; ``L = 0`` gets no rows.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.elbo import segment_subsets
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, completion_segments, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


def stratified_counts(offset: torch.Tensor, length: torch.Tensor, num_mc: int) -> torch.Tensor:
    """VRPO's mask counts: ``x_j = round_half_even(k + j * L / n)`` wrapped into ``[1, L]`` (module docstring),
    in exact integer arithmetic. ``offset`` ``k`` and ``length`` ``L`` are integer tensors of one shape;
    returns ``[..., n]`` (0 where ``L = 0``)."""
    n = num_mc
    j = torch.arange(n, device=length.device)
    num = offset[..., None] * n + j * length[..., None]  # n * v_j, exactly
    q, r = torch.div(num, n, rounding_mode="floor"), num % n
    up = (2 * r > n) | ((2 * r == n) & (q % 2 == 1))  # round half to even, as torch.round / numpy do
    x = q + up.long()
    big = length[..., None].clamp(min=1)
    x = (x - 1) % big + 1
    return torch.where(length[..., None] > 0, x, torch.zeros_like(x))


@register("vrpo")
def plan_vrpo(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 4,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """VRPO's stratified ELBO rows (LLaDA 1.5, arXiv 2505.19223: optimal allocation, one mask per count; counts
    stratified by one offset as in DARE's ``_forward_process_vrpo``): ``num_mc`` rows per sample (per block on
    block models), row ``j`` masking ``x_j`` counted tokens with weight ``L / x_j``. ``info``: ``offset``
    ``[B, S]`` (``k``), ``num_masked`` ``[D, B]`` (``x_j``, summed over blocks), ``length`` ``[B]``."""
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    g_n = batch.completion_len
    dev = batch.completion_ids.device
    seg, s_n = completion_segments(model, batch)  # [B, G]; S = 1 for full attention
    u = rng.rand(s_n).to(dev)  # [B, S]: the offsets' draws
    keys = rng.rand(d_n, g_n).to(dev)  # [B, D, G]: the subsets' draws
    counted = batch.completion_mask
    length = torch.zeros(counted.shape[0], s_n, dtype=torch.long, device=dev)
    length.scatter_add_(1, seg, counted.long())  # [B, S]
    offset = torch.minimum(torch.floor(u * length).long() + 1, length.clamp(min=1))  # k ~ U{1..L}
    x = stratified_counts(offset, length, d_n).transpose(1, 2)  # [B, D, S]
    subset = segment_subsets(keys, counted, seg, x, length)  # [B, D, G]
    w = length[:, None, :].float() / x.float().clamp(min=1)  # [B, D, S]
    w = w.gather(-1, seg[:, None, :].expand(-1, d_n, -1))  # [B, D, G]
    return draw_rows(
        model, batch, [(subset, w)], d_n, mask_uncounted=mask_uncounted,
        info={"offset": offset, "num_masked": x.sum(-1).t().float(), "length": batch.lengths.float()},
    )
