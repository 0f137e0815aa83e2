"""BGPO, boundary-guided policy optimization (Lin et al. 2025, arXiv 2510.11683).

BGPO maximises a lower bound of the ELBO-based sequence objective that is *linear* in the Monte-Carlo
draws: a sum of terms that each depend on one draw, so the gradient can be accumulated draw by draw and
the memory of an update stays flat in the number of draws; on-policy its value and gradient equal those
of the ELBO-based objective (arXiv 2510.11683, abstract and method section). Its released code
(THU-KEG/BGPO) could not be read here, and the paper's equation numbers could not be checked: the bound
below is built from those two stated properties.

With ``z_d = (E_new,d - E_old,d) / L`` the per-token log-ratio of draw ``d`` (``E_d`` the draw's ELBO term,
``L`` the completion length; ESPO's sequence ratio is ``exp(mean_d z_d)``):

* ``A >= 0``: ``A exp(mean_d z_d) >= A (1 + mean_d z_d)`` (the tangent of ``exp`` at 0);
* ``A < 0``: ``A exp(mean_d z_d) >= A mean_d exp(z_d)`` (Jensen: ``exp`` of a mean <= mean of ``exp``).

Both sides are sums over draws, equal ``A`` with gradient ``A grad(mean_d z_d)`` when new = old. The loss
is minus the mean over sequences. Its block-level form for block models is the
``elbo`` estimator on a block model: every block its own noise level given the clean earlier blocks. With
``draw_by_draw`` the trainer back-propagates one draw at a time (:mod:`dllm_rl.rl.draw_backward`).
No clipping (the bound is used on-policy; ``train.num_iterations=1``), KL as in ESPO's sequence loss.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss
from dllm_rl.rl.method import Method, Preset


def draw_log_ratios(new: TokenScores, old: TokenScores, lengths: torch.Tensor) -> torch.Tensor:
    """``[D, B]``: ``z_d = (sum_g w logp_new - sum_g w logp_old) / L`` per draw."""
    e_new = (new.weight * new.logp).sum(-1)
    e_old = (old.weight * old.logp.detach()).sum(-1)
    return (e_new - e_old) / lengths.float().clamp(min=1.0)[None, :]


@register_loss("bgpo", kl_level="sequence", draw_by_draw=True)
def bgpo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """BGPO's linear lower bound (arXiv 2510.11683, method section; see the module docstring):
    ``-mean_b [A_b (1 + mean_d z_db)]`` for ``A_b >= 0`` and ``-mean_b [A_b mean_d exp(z_db)]`` for ``A_b < 0``."""
    check_options(config, "bgpo", ())
    z = draw_log_ratios(new, old, lengths)  # [D, B]
    adv = advantages.float()
    bound = torch.where(adv[None, :] >= 0, 1.0 + z, torch.exp(z))  # [D, B]
    loss = -(adv * bound.mean(0)).mean()
    ratio = torch.exp(z.detach().mean(0))
    stats = {"ratio_mean": float(ratio.mean()), "ratio_max_dev": float((ratio - 1).abs().max())}
    return LossOutput(loss, stats)


# 16 MC draws: the paper's large-sample setting (not confirmed from its code).
METHOD = Method(
    name="bgpo", paper="BGPO, arXiv 2510.11683", recipe="llada-bgpo-math.yaml",
    preset=Preset(estimator="elbo", estimator_options={"num_mc": 16, "coupled": False}, loss_type="bgpo",
                loss_aggregation="seq_mean", beta=0.0, kl_estimator="k2", advantage="group_zscore",
                scale_rewards="group", estimator_noise="sample"),
    notes={"estimator": "block ELBO on block models", "loss": "linear lower bound, back-propagated draw by draw"},
)
