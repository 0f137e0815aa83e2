"""wd1: a ratio-free, weighted log-likelihood objective (Tang et al. 2025, arXiv 2507.08838; facts from
xiaohangt/wd1, its ``wll_d1_neg`` trainer, the "NP" runs without a reference policy).

wd1 replaces GRPO's ratio by weights on the sequence log-likelihood: within a prompt's group, with
``A_i = r_i - mean_group(r)`` (unscaled), ``w+_i = softmax_group(A)_i`` and ``w-_i = softmax_group(-A)_i``,

    loss = -sum_i w+_i log pi(y_i) + sum_i w-_i log pi(y_i)

(raise the likelihood of the better completions, lower that of the worse), with ``log pi`` d1's one-step
mean-field estimate summed over the completion tokens (``estimator=mean_field``, ``p_mask_prompt=0.15``).
The paper's equation numbers could not be checked here.

Here the weights are an advantage rule, ``wd1_weights`` (``w+ - w-`` per sample, computed per group where
the groups are known), and the loss ``weighted_loglik`` is ``-mean_b adv_b * S_b`` with ``S_b`` the
estimator's ``sequence_score``. The released loss sums over the group's samples; the mean here is that
sum divided by the group size (a constant factor in the learning rate). No ratio, no KL (``beta`` is
used when set, as a k3-or-other KL on the sequence score per token).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.advantages import _groups, register_advantage
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss
from dllm_rl.rl.method import Method, Preset


@register_advantage("wd1_weights")
def wd1_weights(rewards: torch.Tensor, group_size: int, scale_rewards: str = "none") -> torch.Tensor:
    """wd1's weights (arXiv 2507.08838, its weighted log-likelihood objective): ``softmax_g(A) - softmax_g(-A)``
    with ``A = r - mean_g(r)`` in each group ``g``; ``scale_rewards`` is not used (wd1 does not scale)."""
    g = _groups(rewards, group_size)
    a = g - g.mean(dim=1, keepdim=True)
    return (torch.softmax(a, dim=1) - torch.softmax(-a, dim=1)).reshape(-1)


@register_loss("weighted_loglik", kl_level="sequence", ratio_free=True)
def weighted_loglik_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """wd1's ratio-free weighted log-likelihood (arXiv 2507.08838): ``-mean_b adv_b * S_b`` with ``S_b`` the
    sequence log-likelihood estimate (``sequence_score``) and ``adv`` the ``wd1_weights``; ``old`` unused."""
    check_options(config, "weighted_loglik", ())
    score = new.sequence_score()
    loss = -(advantages.float() * score).mean()
    stats = {"weight_abs_mean": float(advantages.float().abs().mean())}
    return LossOutput(loss, stats)


METHOD = Method(
    name="wd1", paper="wd1, arXiv 2507.08838", recipe="llada-wd1-countdown.yaml",
    preset=Preset(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="weighted_loglik",
                loss_aggregation="seq_mean", beta=0.0, kl_estimator="k3", advantage="wd1_weights",
                scale_rewards="none", estimator_noise="sample"),
    notes={"loss": "ratio-free"},
)
