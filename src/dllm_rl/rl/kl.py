"""KL estimators against a frozen reference, registered by name in :data:`KL_ESTIMATORS`.

Every estimator has one signature, ``kl(logp, logp_ref) -> tensor`` (elementwise, float), on samples from
the current policy ``pi``. With ``log_r = logp_ref - logp`` (``r = pi_ref / pi``) the three estimators of
Schulman's note "Approximating KL divergence" (2020) are

* ``k1 = -log_r``: unbiased, high variance, can be negative;
* ``k2 = log_r**2 / 2``: biased, low variance, non-negative; ESPO's choice (arXiv 2512.03759, its KL
  regularisation section), applied at sequence level to the per-token normalised ELBO difference;
* ``k3 = (r - 1) - log_r``: unbiased and non-negative; GRPO's per-token KL (DeepSeekMath arXiv 2402.03300
  Eq. 4), used by d1's diffu-GRPO (arXiv 2504.12216) too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """``k1 = log pi - log pi_ref`` (Schulman 2020, "Approximating KL divergence": the naive estimator)."""
    return logp - logp_ref


def k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """``k2 = (log pi_ref - log pi)^2 / 2`` (Schulman 2020; ESPO arXiv 2512.03759's KL estimator)."""
    return 0.5 * (logp_ref - logp).pow(2)


def k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """``k3 = pi_ref / pi - 1 - log(pi_ref / pi)`` (Schulman 2020; GRPO arXiv 2402.03300 Eq. 4)."""
    log_r = (logp_ref - logp).clamp(-20.0, 20.0)  # keeps exp finite on far-off samples
    return torch.exp(log_r) - 1.0 - log_r


KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": k1, "k2": k2, "k3": k3}


def kl_estimate(name: str, logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """KL estimator ``name`` (see :data:`KL_ESTIMATORS`) of ``logp`` against ``logp_ref``."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; choose one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name](logp, logp_ref)
