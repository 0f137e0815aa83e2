"""EBPO, ELBO-based block-level policy optimization (LLaDA2.1 report, arXiv 2602.08676, Eq. 4-5).

The report's text could not be read here, and its code (inclusionAI) is closed; the facts come from the one public
implementation, DARE (yjyddq/DARE ``verl/trainer/ppo/dllm_core_algos.py``: ``compute_policy_loss_ebpo``;
``verl/workers/actor/ebpo_actor_mixin.py``), a third-party reconstruction that says it follows Eq. 4-5. Where the
two could disagree we follow DARE's code.

* Estimator ``ebpo_block`` (:mod:`dllm_rl.estimators.ebpo_block`): the block-composite ELBO ``l(y)``, every block of
  every draw its own stratified noise level with at least one masked token, weight ``|b| / k``; 16 draws.
* Loss ``ebpo``: one PPO clip on the *sequence-level* composite ratio ``log r = l_new(y) - l_old(y)`` (not divided by
  the length, unlike ESPO), in log space: ``A >= 0``: ``min(log r, log(1 + eps_high))``, ``A < 0``:
  ``max(log r, log(1 - eps))``, loss ``-A exp(that)`` (``= max(-A r, -A clip(r))``; no dual clip), mean over the
  sequences with a counted token. The same stored masks score the old, current and reference policy (common random
  numbers: the first ratio is exactly 1).
* Draw-by-draw backward (DARE's memory trick, exact): :mod:`dllm_rl.rl.draw_backward`.
* Advantage: GRPO's group z-score (DARE: ``adv_estimator=grpo``, unbiased std; its ``std + 1e-6`` is ours
  ``std + 1e-4``, the library's one z-score).
* KL: off in DARE's recipes. Deviation: with ``beta > 0`` ours is the sequence-level KL on ``l / L`` (ESPO's level);
  DARE's is on ``l`` itself (``d = l - l_ref``, k3 for ``low_var_kl``).
"""

from __future__ import annotations

import math

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss
from dllm_rl.rl.method import Method, Preset


@register_loss("ebpo", kl_level="sequence", draw_by_draw=True)
def ebpo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """EBPO's clipped surrogate on the sequence-level composite ratio (arXiv 2602.08676, Eq. 4-5; DARE's
    ``compute_policy_loss_ebpo``): see the module docstring. Statistics: ``clip_frac``, ``ratio_mean``,
    ``ratio_max_dev``, ``ppo_kl`` (mean of ``-log r``)."""
    check_options(config, "ebpo", ())
    if advantages.dim() != 1:
        raise ValueError(f"the ebpo loss takes one advantage per sample ([B]), got shape {tuple(advantages.shape)}")
    log_r = new.sequence_score() - old.sequence_score().detach()
    adv = advantages.float()
    high, low = math.log1p(config.clip_high), math.log1p(-config.epsilon) if config.epsilon < 1 else -math.inf
    effective = torch.where(adv >= 0, log_r.clamp(max=high), log_r.clamp(min=low))
    valid = (lengths > 0).float()
    loss = (-adv * torch.exp(effective) * valid).sum() / valid.sum().clamp(min=1.0)
    lr = log_r.detach()
    clipped = ((adv > 0) & (lr > high)) | ((adv < 0) & (lr < low))
    ratio = torch.exp(lr)
    stats = {"clip_frac": float(clipped.float().mean()), "ratio_mean": float(ratio.mean()),
             "ratio_max_dev": float((ratio - 1).abs().max()), "ppo_kl": float((-lr).mean())}
    return LossOutput(loss, stats)


# DARE's LLaDA2-mini recipe: 16 draws; its block is the model's (block models) or the rollout's (block_length).
METHOD = Method(
    name="ebpo", paper="EBPO (LLaDA2.1), arXiv 2602.08676", recipe="llada2-ebpo-math.yaml",
    preset=Preset(estimator="ebpo_block", estimator_options={"num_mc": 16}, loss_type="ebpo",
                loss_aggregation="seq_mean", beta=0.0, kl_estimator="k3", advantage="group_zscore",
                scale_rewards="group", estimator_noise="sample"),
    notes={"estimator": "block-composite ELBO, >= 1 masked token per block",
           "loss": "one clip on the sequence-level composite ratio, back-propagated draw by draw"},
)
