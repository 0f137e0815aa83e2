"""``spg_block``: SPG's block-wise masking (arXiv 2510.09541, section 3; the released code's ``block_random``).

Per draw a block ``k`` of the completion is drawn; blocks before it stay clean, ``m ~ U{max(floor(m_k min_t), 1) ..
min(floor(m_k max_t), m_k)}`` of block ``k``'s counted tokens are masked, every later block is fully masked, and
the tokens outside ``completion_mask`` are masked too (as the released code does). Every masked counted token gets
weight ``L / n`` (``n`` masked counted tokens in the draw, ``L`` counted in all), so ``sequence_score()`` is ``L``
times SPG's per-draw mean of the masked log-probs, averaged over draws. With one block (``block_length=None`` on a
full-attention model) this is the "exactly n masked" ELBO of LLaDA (``n ~ U{1..L}``). Block models use their own
blocks in the two-stream layout. The SPG method (:mod:`dllm_rl.rl.methods.spg`) pairs it with its EUBO/ELBO loss.

Deviation: the released code draws the ``num_t`` blocks of a sample without replacement; here each draw picks its
block independently (same marginal).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int, check_unit_interval
from dllm_rl.estimators.elbo import random_subsets
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, decoding_blocks, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("spg_block")
def plan_spg_block(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 2,
    block_length: int | None = None,
    min_t: float = 0.0,
    max_t: float = 1.0,
    p_mask_prompt: float = 0.0,
) -> MaskedRows:
    """SPG's block-wise masking (arXiv 2510.09541, section 3, block-wise masking; the released code's
    ``block_random``): see the module docstring. ``block_length``: the decoding block of a full-attention
    model (None: the whole completion is one block); block models use the batch's layout block
    (``batch.block_size``, else the model's). ``info``: ``block`` ``[D, B]`` (the partly masked block),
    ``num_masked`` ``[D, B]``. One row per sample and draw."""
    d_n = check_int("num_mc", num_mc, 1)
    if block_length is not None:
        check_int("block_length", block_length, 1)
    lo_t, hi_t = check_unit_interval("min_t", min_t), check_unit_interval("max_t", max_t)
    if lo_t > hi_t:
        raise ValueError(f"min_t must be <= max_t, got {min_t} and {max_t}")
    p_prompt = check_unit_interval("p_mask_prompt", p_mask_prompt)
    rng = RowRandom(generator, batch)
    dev = batch.completion_ids.device
    counted = batch.completion_mask
    seg = decoding_blocks(model, batch, block_length).to(dev)  # [B, G]
    u_block, u_count = rng.rand(d_n).to(dev), rng.rand(d_n).to(dev)  # [B, D]
    keys = rng.rand(d_n, batch.completion_len).to(dev)  # [B, D, G]
    prompt_draw = rng.rand(d_n, batch.prompt_len).to(dev) < p_prompt  # [B, D, P]
    n_blocks = torch.where(counted, seg + 1, torch.zeros_like(seg)).max(-1).values  # [B]
    k = torch.minimum((u_block * n_blocks[:, None]).floor().long(), (n_blocks - 1).clamp(min=0)[:, None])
    in_k = (seg[:, None, :] == k[..., None]) & counted[:, None, :]  # [B, D, G]
    m = in_k.sum(-1)  # [B, D]
    lo = torch.clamp((m.float() * lo_t).floor().long(), min=1)
    hi = torch.maximum(torch.minimum((m.float() * hi_t).floor().long(), m), lo)
    count = torch.minimum(lo + (u_count * (hi - lo + 1)).floor().long(), hi)
    count = torch.where(m > 0, count, torch.zeros_like(count))
    masked = random_subsets(keys, in_k, count) | ((seg[:, None, :] > k[..., None]) & counted[:, None, :])
    n = masked.sum(-1)  # [B, D]
    weight = batch.lengths[:, None].float() / n.clamp(min=1).float()
    return draw_rows(
        model, batch, [(masked, weight[..., None].expand_as(keys))], d_n, mask_uncounted=True,
        prompt_masked=prompt_draw & batch.prompt_mask[:, None, :],
        info={"block": k.t().float(), "num_masked": n.t().float()},
    )
