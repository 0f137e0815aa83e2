"""CJ-GRPO, consistency-trajectory GRPO (Yang et al. 2025, arXiv 2509.23924; we follow DARE's implementation,
arXiv 2604.04215, which cites it).

The policy is the rollout's own denoising trajectory: with ``U_k`` the positions step ``k`` committed,

    log pi(x^(k) | x^(k-1)) = sum_{i in U_k} log p_theta(y_i | x^(k-1))

where ``x^(k-1)`` is the prompt, the tokens committed before step ``k`` and every other completion position
masked. The loss optimises the very transitions the sampler took (no skip-step from a random partial state), so
there is one forward per decoding step.

* Estimator: ``trace`` (:mod:`dllm_rl.estimators.trace`) with ``shrinkage: 1`` rebuilds each state from the
  rollout's ``step_map`` and scores the committed tokens; ``mask_uncounted: true`` masks the EOS padding after
  the answer until its own step, as in the rollout (DARE rebuilds every position from its recorded step). Block
  models (SDAR) replay the same local step of every block in one two-stream forward; each (block, local step) is
  its own transition, as in DARE's block-parallel "paper-exact" path. ``step_merge: true`` is DARE's
  ``step_merge``: one transition per decoding block (DARE only; not in the authors' code).
* Loss ``cj_grpo``: PPO's clipped surrogate per scored token with DARE's dual clip (``loss_options.dual_clip`` =
  verl's ``clip_ratio_c``, 3): where ``A < 0`` the token's loss is ``min(max(-A r, -A clip(r)), -A c)``. Token
  terms are averaged within each transition, then over the sample's transitions, then over the samples (the
  paper's Eq. 11 as DARE's test of it reads; DARE's ``compute_cj_block_step_token_weights``).
* Advantages: GRPO's group z-score, ``(r - mean) / std`` (DARE's ``grpo`` estimator). KL off (every DARE recipe).

Where the paper's authors' code (yjyddq/EOSER-ASS-RL, ``cj-grpo/``) and DARE differ, we follow DARE:

1. Advantage: the authors centre only (``r - mean``); DARE divides by the unbiased group std (+1e-6; ours adds the
   library's 1e-4).
2. Clip: the authors use symmetric PPO clipping with epsilon 0.5 and no dual clip; DARE epsilon 0.2 and dual clip 3.
3. KL: the authors add k3 per token with beta 0.04 and a reference synced every 64 steps; DARE has none. Setting
   ``beta`` adds ``beta * KL`` per token, reduced by ``loss_aggregation`` (not per transition).
4. The authors run 8-12 PPO iterations per rollout batch; DARE one on-policy pass.
5. Reduction: the authors (and DARE's LLaDA/Dream actors) take each step's token mean over the whole micro-batch
   and divide by the number of steps ``K``, counting steps that committed only post-EOS padding; we take DARE's
   paper-exact form (transition mean, then sample mean, counting transitions that commit an answer token). With
   one sample per micro-batch and no padding-only steps the two agree.
6. The authors also decode with EOSER / ascending step sizes; DARE (and we) use low-confidence semi-AR decoding.
   DARE's Fast-dLLM path commits one token per step against the total step count (256 transitions for 128
   steps); our schedule is ``rollout.steps`` per block.

The log-probs are taken at temperature 1 (raw logits), as both codes do, although the rollout samples at its own
temperature.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, clipped_surrogate, register_loss
from dllm_rl.rl.method import Method, Preset


def dual_clip(per_token: torch.Tensor, adv: torch.Tensor, c: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, bit)``: dual-clip PPO (Ye et al. 2020, arXiv 1912.09729, Eq. 6; verl's ``compute_policy_loss``
    with ``clip_ratio_c``): where ``A < 0`` a token's clipped-surrogate loss is capped at ``-A c``, so a ratio far
    above 1 on a bad sample stops pushing. ``bit`` marks the capped tokens; ``c=None`` leaves the loss as it is."""
    if c is None:
        return per_token, torch.zeros_like(per_token, dtype=torch.bool)
    cap = -adv * c
    bit = (adv < 0) & (per_token > cap)
    return torch.where(adv < 0, torch.minimum(per_token, cap), per_token), bit


def transition_mean(terms: torch.Tensor, active: torch.Tensor, transition: torch.Tensor) -> torch.Tensor:
    """CJ-GRPO's reduction (arXiv 2509.23924 Eq. 11, as DARE implements it): the mean of the ``active`` token
    ``terms`` (``[D, B, G]``) of each transition (tokens of a draw and sample with one ``transition`` id), then
    the mean over each sample's transitions, then over the draws and samples (a sample without a scored token adds
    0 to the mean, as in DARE, whose weights divide by every sample of the mini-batch)."""
    ids = transition.long().expand_as(terms)
    if bool((active & (ids < 0)).any()):
        raise ValueError("cj_grpo: a scored token has no transition (info['transition'] is -1 where weight != 0)")
    ids = torch.where(active, ids, 0)
    n = int(ids.max().item()) + 1 if ids.numel() else 1
    zeros = terms.new_zeros(*terms.shape[:2], n)
    sums = zeros.scatter_add(-1, ids, torch.where(active, terms, torch.zeros_like(terms)))
    counts = zeros.detach().scatter_add(-1, ids, active.float())
    per_sample = (sums / counts.clamp(min=1.0)).sum(-1) / (counts > 0).sum(-1).clamp(min=1)
    return per_sample.mean()


@register_loss("cj_grpo", kl_level="token")
def cj_grpo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """CJ-GRPO's objective (arXiv 2509.23924, Eq. 11; DARE's ``compute_policy_loss`` per transition): the token
    ratio ``exp(logp_new - logp_old)`` in PPO's clipped surrogate (``epsilon`` / ``epsilon_high``) with the dual
    clip ``loss_options.dual_clip`` (default 3; ``null`` = off, the authors' code) for ``A < 0``, reduced by
    :func:`transition_mean` over the estimator's ``info["transition"]`` (the ``trace`` estimator's; without it
    each draw of a sample is one transition). ``config.aggregation`` is unused. ``advantages``: ``[B]`` or
    ``[B, G]``."""
    check_options(config, "cj_grpo", ("dual_clip",))
    c = config.option("dual_clip", 3.0)
    if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or c <= 1):
        raise ValueError(f"loss_options.dual_clip: the dual-clip constant must be a number > 1 (DARE: 3) or null, "
                         f"got {c!r}")
    adv = advantages.float().view(1, -1, 1) if advantages.dim() == 1 else advantages.float()[None]
    ratio = torch.exp(new.logp - old.logp.detach())
    per_token, was_clipped = clipped_surrogate(ratio, adv, config.epsilon, config.clip_high)
    per_token, bit = dual_clip(per_token, adv, None if c is None else float(c))
    active = new.weight != 0
    transition = new.info.get("transition", torch.zeros_like(active, dtype=torch.long))
    loss = transition_mean(new.weight * per_token, active, transition)
    any_active = bool(active.any())
    stats = {
        "clip_frac": float(was_clipped[active].float().mean()) if any_active else 0.0,
        "dual_clip_frac": float(bit[active].float().mean()) if any_active else 0.0,
        "ratio_mean": float(ratio.detach()[active].mean()) if any_active else 1.0,
        "ratio_max_dev": float((ratio.detach()[active] - 1).abs().max()) if any_active else 0.0,
    }
    return LossOutput(loss, stats)


METHOD = Method(
    name="cj_grpo", paper="CJ-GRPO, arXiv 2509.23924", recipe="llada-cj-grpo-gsm8k.yaml",
    preset=Preset(estimator="trace", estimator_options={"shrinkage": 1, "mask_uncounted": True}, loss_type="cj_grpo",
                loss_options={"dual_clip": 3.0}, loss_aggregation="seq_mean", beta=0.0, kl_estimator="k3",
                advantage="group_zscore", scale_rewards="group", estimator_noise="sample"),
    notes={"estimator": "every decoding step its own transition", "loss": "dual clip 3, mean per transition"},
)
