"""``ebpo_block``: EBPO's block-composite ELBO (LLaDA2.1 report, arXiv 2602.08676, its EBPO section, Eq. 4-5).

EBPO scores a completion by the sum over its decoding blocks of each block's ELBO term, every block with its own
noise level in every Monte-Carlo draw, and averages the draws:

    l(y) = (1/N) sum_n sum_b (|b| / k_nb) sum_{i in b masked in draw n} log p(y_i | ...)

The report's text could not be read here; the facts come from the one public implementation, DARE
(yjyddq/DARE, ``verl/trainer/ppo/dllm_core_algos.py``: ``_forward_process_ebpo``, ``compute_ebpo_composite_elbo``),
a third-party reconstruction that says it follows Eq. 4-5. Its choices, followed here:

* **At least one masked token per block in every draw**: block ``b`` of draw ``n`` gets a level ``t_nb`` and
  masks ``k_nb = min(floor(t_nb |b|) + 1, |b|)`` of its counted tokens, a uniformly random subset.
* **Weight** ``|b| / k_nb``: the realised mask fraction's inverse (not ``1/t``); no division by a length.
* **Stratified levels across all cells of a sample**: with ``M = N x B_s`` cells (draw-major: draw 0's blocks in
  order, then draw 1's ...; ``B_s`` the sample's blocks that hold counted tokens) one ``u ~ U[0, 1)`` per sample
  gives ``t_j = (u + j / M) mod 1``: each cell's level is uniform and the set is evenly spaced.
* **Blocks**: block models use their layout's blocks counted from the block that holds the first completion token
  (DARE's ``block_origin="global"``), scored in the two-stream layout, so block ``b`` sees the prompt, the clean
  earlier blocks and its own noisy state: every block of a draw in one forward. A first or last block may be partial.

Full-attention models (deviation; DARE runs EBPO on block models only): the blocks are the rollout's decoding
blocks (``block_length`` columns from the completion's start, as ``spg_block``; ``None``: one block) and a draw is
one row in which every block is masked at its own level, so a block sees the other blocks' noisy states rather
than clean earlier blocks (the exact block conditionals would take one row per block).

Tokens outside ``completion_mask`` are never masked nor scored (clean context). ``info``: ``num_masked`` ``[D, B]``
(``sum_b k_nb``), ``num_blocks`` ``[B]`` (``B_s``).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.elbo import segment_subsets
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, decoding_blocks, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


def stratified_levels(u: torch.Tensor, block_length: torch.Tensor, num_draws: int) -> torch.Tensor:
    """``[B, D, S]`` float64: the level ``t = (u + j / M) mod 1`` of each (draw, block) cell, ``j`` its draw-major
    rank among the sample's ``M = D x B_s`` cells of non-empty blocks; ``u`` ``[B]``, ``block_length`` ``[B, S]``
    (counted tokens per block; empty blocks get a level too, which masks nothing)."""
    nonempty = block_length > 0
    rank = nonempty.long().cumsum(-1) - 1  # [B, S]: the block's rank among the non-empty ones
    n_blocks = nonempty.sum(-1).clamp(min=1)  # [B]
    d = torch.arange(num_draws, device=u.device)[None, :, None]
    cell = d * n_blocks[:, None, None] + rank[:, None, :].clamp(min=0)  # [B, D, S]
    cells = (num_draws * n_blocks).double()[:, None, None]
    return torch.remainder(u.double()[:, None, None] + cell.double() / cells, 1.0)


def masked_counts(t: torch.Tensor, block_length: torch.Tensor) -> torch.Tensor:
    """``[B, D, S]`` long: ``k = min(floor(t |b|) + 1, |b|)`` masked tokens per cell (0 for an empty block)."""
    lengths = block_length[:, None, :].expand_as(t)
    k = torch.minimum(torch.floor(t * lengths.double()).long() + 1, lengths)
    return torch.where(lengths > 0, k, torch.zeros_like(k))


@register("ebpo_block")
def plan_ebpo_block(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    num_mc: int = 16,
    block_length: int | None = None,
) -> MaskedRows:
    """EBPO's block-composite ELBO (arXiv 2602.08676, Eq. 4-5, as DARE implements it; see the module docstring):
    ``num_mc`` draws, each masking ``k_nb >= 1`` tokens of every block at stratified levels, weight ``|b| / k_nb``.
    ``block_length``: the decoding block of a full-attention model (block models use their layout's). One row per
    sample and draw."""
    d_n = check_int("num_mc", num_mc, 1)
    if block_length is not None:
        check_int("block_length", block_length, 1)
    rng = RowRandom(generator, batch)
    dev = batch.completion_ids.device
    counted = batch.completion_mask
    u = rng.rand().to(dev)  # [B]: one offset per sample
    keys = rng.rand(d_n, batch.completion_len).to(dev)  # [B, D, G]
    seg = decoding_blocks(model, batch, block_length).to(dev)  # [B, G]
    s_n = int(seg.max().item()) + 1 if seg.numel() else 1
    length = torch.zeros(counted.shape[0], s_n, dtype=torch.long, device=dev)
    length.scatter_add_(1, seg, counted.long())  # [B, S]: |b|, counted tokens of each block
    k = masked_counts(stratified_levels(u, length, d_n), length)  # [B, D, S]
    subset = segment_subsets(keys, counted, seg, k, length)  # [B, D, G]
    weight = length[:, None, :].float() / k.clamp(min=1).float()  # [B, D, S]
    token_weight = weight.gather(-1, seg[:, None, :].expand(-1, d_n, -1))  # [B, D, G]
    return draw_rows(model, batch, [(subset, token_weight)], d_n,
                     info={"num_masked": k.sum(-1).t().float(), "num_blocks": (length > 0).sum(-1).float()})
