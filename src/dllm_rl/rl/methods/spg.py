"""SPG, the sandwiched policy gradient (Wang et al. 2025, arXiv 2510.09541; facts from facebookresearch/SPG).

SPG maximises a lower bound of ``log pi(y|x)`` (the ELBO) on sequences with a positive advantage and
minimises an upper bound (the EUBO) on the others, so that neither side's gradient is biased the way a
one-sided ELBO surrogate is (arXiv 2510.09541, section 3; the paper's equation numbers could not be
checked here, only its released code).

* Estimator ``spg_block`` (:mod:`dllm_rl.estimators.spg_block`): the paper's block-wise masking.
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

SPG defines no KL term (``beta`` must be 0).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss
from dllm_rl.rl.method import Method, Preset


def eubo_scores(scores: TokenScores, lengths: torch.Tensor, eubo_beta: float) -> torch.Tensor:
    """``[B]``: SPG's evidence upper bound (arXiv 2510.09541, section 3, the EUBO of the negative-advantage
    sequences, in the released code's reduction): ``L * mean_{i: a_i > 0} (1/beta) log a_i`` with
    ``a_i = mean_d weight_di * p_di^beta``."""
    a = (scores.weight * torch.exp(eubo_beta * scores.logp)).mean(0)  # [B, G]
    keep = a > 0
    log_a = torch.log(torch.where(keep, a, torch.ones_like(a)))
    per_token = log_a.sum(-1) / keep.sum(-1).clamp(min=1) / eubo_beta
    return lengths.float() * per_token


@register_loss("spg", kl_level=None, ratio_free=True)
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


METHOD = Method(
    name="spg", paper="SPG, arXiv 2510.09541", recipe="llada-spg-countdown.yaml",
    preset=Preset(estimator="spg_block", estimator_options={"num_mc": 2}, loss_type="spg",
                loss_options={"mode": "mix", "eubo_beta": 1.5, "mix_weight": 0.5}, loss_aggregation="seq_mean",
                beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="none", estimator_noise="sample"),
    notes={"estimator": "block-wise masking", "loss": "ELBO for A > 0, EUBO/ELBO mix otherwise; ratio-free"},
)
