"""SPG, the sandwiched policy gradient (Wang et al. 2025, arXiv 2510.09541; facts from facebookresearch/SPG).

SPG maximises a lower bound of ``log pi(y|x)`` (the ELBO) on sequences with a positive advantage and
minimises an upper bound (the EUBO) on the others, so that neither side's gradient is biased the way a
one-sided ELBO surrogate is (arXiv 2510.09541, section 3; the paper's equation numbers could not be
checked here, only its released code).

* Estimator ``spg_block`` (the paper's block-wise masking, "block_random" in the released code): per draw a
  block ``k`` of the completion is drawn; blocks before it stay clean, ``m ~ U{max(floor(m_k min_t), 1) ..
  min(floor(m_k max_t), m_k)}`` of block ``k``'s counted tokens are masked, every later block is fully
  masked, and the tokens outside ``completion_mask`` are masked too (as the released code does). Every
  masked counted token gets weight ``L / n`` (``n`` masked counted tokens in the draw, ``L`` counted in
  all), so ``sequence_score()`` is ``L`` times SPG's per-draw mean of the masked log-probs, averaged over
  draws. With one block (``block_length=None`` on a full-attention model) this is the "exactly n masked"
  ELBO of LLaDA (``n ~ U{1..L}``). Block models use their own blocks in the two-stream layout.
* Loss ``spg``: ratio-free, ``-sum_b A_b S_b / sum_b L_b`` with ``S_b`` the ELBO when ``A_b > 0``, else the
  EUBO (``mode=eubo``), the mixture ``w EUBO + (1 - w) ELBO`` (``mode=mix``, the paper's "SPG w/ Mixture") or
  the ELBO (``mode=elbo``). The EUBO of token ``i`` is ``(1/beta) log E_d[w_di p_di^beta]`` (the mean over
  draws of its weighted, powered probability; draws that do not mask it add 0), and a sequence's EUBO is
  ``L`` times the mean over its tokens with a positive term (the released code's reduction).

When the EUBO is an upper bound: with one block each token's weights ``L / n`` over the draws that mask it
sum to 1, so ``(1/beta) log E[p^beta] >= log E[p] >= E[log p]`` per token for every ``beta >= 1`` (the
released Sudoku scripts use ``beta = 1``). It bounds ``log pi(y|x)`` from above when the model's conditionals
are those of one joint distribution (every unmasking order then gives the same product, and the ELBO is
tight). A network's conditionals need not be: on a random tiny model exact enumeration puts the EUBO at
``beta = 1`` up to 0.15 nats below ``log pi`` (float64 gives the same numbers), and ``beta`` up to 1.39 was
needed there (tests/estimators/test_estimator_methods.py checks 1.5 and 2). With several blocks the weights
of a token no longer sum to 1 (two blocks of 4: 0.365 and 1.635), in the released code too, so the
guarantee is the one-block case's. With few draws the log of a sample mean also biases the estimate down.

Deviation: the released code draws the ``num_t`` blocks of a sample without replacement; here each draw
picks its block independently (same marginal). SPG defines no KL term (``beta`` must be 0).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import MaskedRows, ScoringBatch, TokenScores, register
from dllm_rl.estimators.checks import check_int, check_unit_interval
from dllm_rl.estimators.elbo import random_subsets
from dllm_rl.estimators.rows import RowRandom, completion_segments, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss


def _blocks(model: DiffusionLM, batch: ScoringBatch, block_length: int | None) -> torch.Tensor:
    """``[B, G]``: the block of each completion token (counted from the completion's first block)."""
    if model.is_block_causal:
        return completion_segments(model, batch)[0]
    g = torch.arange(batch.completion_len, device=batch.completion_ids.device)
    seg = g // block_length if block_length else torch.zeros_like(g)
    return seg[None, :].expand(batch.batch_size, -1)


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
    seg = _blocks(model, batch, block_length).to(dev)  # [B, G]
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


def eubo_scores(scores: TokenScores, lengths: torch.Tensor, eubo_beta: float) -> torch.Tensor:
    """``[B]``: SPG's evidence upper bound (arXiv 2510.09541, section 3, the EUBO of the negative-advantage
    sequences, in the released code's reduction): ``L * mean_{i: a_i > 0} (1/beta) log a_i`` with
    ``a_i = mean_d weight_di * p_di^beta``."""
    a = (scores.weight * torch.exp(eubo_beta * scores.logp)).mean(0)  # [B, G]
    keep = a > 0
    log_a = torch.log(torch.where(keep, a, torch.ones_like(a)))
    per_token = log_a.sum(-1) / keep.sum(-1).clamp(min=1) / eubo_beta
    return lengths.float() * per_token


@register_loss("spg")
def spg_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """SPG's sandwiched objective (arXiv 2510.09541, section 3): ``-sum_b A_b S_b / sum_b L_b`` with ``S_b``
    the ELBO (``sequence_score``) where ``A_b > 0`` and, elsewhere, the EUBO (:func:`eubo_scores`), their
    mixture ``mix_weight * EUBO + (1 - mix_weight) * ELBO`` or the ELBO, by ``loss_options.mode``
    (``mix`` | ``eubo`` | ``elbo``; defaults ``mix``, ``eubo_beta=1.5``, ``mix_weight=0.5``, the released
    Countdown mixture script). Ratio-free: ``old`` is not used."""
    check_options(config, "spg", ("mode", "eubo_beta", "mix_weight"))
    if config.beta:
        raise ValueError("the spg loss has no KL term (SPG defines none): set beta=0")
    mode = config.option("mode", "mix")
    beta = float(config.option("eubo_beta", 1.5))
    w = float(config.option("mix_weight", 0.5))
    if mode not in ("mix", "eubo", "elbo"):
        raise ValueError(f"loss_options.mode: choose mix, eubo or elbo, got {mode!r}")
    if beta <= 0 or not 0.0 <= w <= 1.0:
        raise ValueError(f"loss_options: eubo_beta must be > 0 and mix_weight in [0, 1], got {beta} and {w}")
    elbo = new.sequence_score()
    if mode == "elbo":
        negative = elbo
    else:
        eubo = eubo_scores(new, lengths, beta)
        negative = eubo if mode == "eubo" else w * eubo + (1.0 - w) * elbo
    adv = advantages.float()
    value = torch.where(adv > 0, elbo, negative)
    loss = -(adv * value).sum() / lengths.float().sum().clamp(min=1.0)
    return LossOutput(loss, {"positive_frac": float((adv > 0).float().mean())})
