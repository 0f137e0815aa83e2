"""KL estimators against a frozen reference (Schulman, "Approximating KL divergence", 2020).

With ``log_r = logp_ref - logp`` (``r = pi_ref / pi``, samples from ``pi``):
``k1 = -log_r`` (unbiased, high variance), ``k2 = log_r**2 / 2`` (low variance, biased; ESPO's
choice, arXiv 2512.03759 sec. 4), ``k3 = (r - 1) - log_r`` (unbiased, non-negative; GRPO's).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return logp - logp_ref


def k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp_ref - logp).pow(2)


def k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    log_r = (logp_ref - logp).clamp(-20.0, 20.0)  # keeps exp finite on far-off samples
    return torch.exp(log_r) - 1.0 - log_r


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": k1, "k2": k2, "k3": k3}


def kl_estimate(name: str, logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; choose one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name](logp, logp_ref)
