"""Policy losses: token-level clipped ratio (GRPO family) and ESPO's sequence-level clipped ratio.

Both take the estimator outputs of the current, old and reference policies (``TokenScores``: per-draw,
per-token ``logp`` and ``weight``), advantages per sequence, and return the loss plus statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dllm_rl.rl.kl import kl_estimate


@dataclass
class LossOutput:
    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def _clipped(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float):
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    obj = torch.minimum(unclipped, clipped)
    was_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    return -obj, was_clipped


def _aggregate(per_token: torch.Tensor, weight: torch.Tensor, aggregation: str, max_length: int) -> torch.Tensor:
    """Reduce ``[D, B, G]`` weighted per-token terms to a scalar.

    ``token_mean``: sum over all scored tokens / their count (DAPO, arXiv 2503.14476 eq. 8);
    ``seq_mean``: per-sequence mean, then mean over sequences (GRPO, arXiv 2402.03300 eq. 3);
    ``fixed_length``: sum / (draws x sequences x ``max_length``) (Dr. GRPO, arXiv 2503.20783).
    """
    active = (weight != 0).float()
    terms = weight * per_token
    if aggregation == "token_mean":
        return terms.sum() / active.sum().clamp(min=1.0)
    if aggregation == "seq_mean":
        per_seq = terms.sum(-1) / active.sum(-1).clamp(min=1.0)  # [D, B]
        has = (active.sum(-1) > 0).float()
        return (per_seq * has).sum() / has.sum().clamp(min=1.0)
    if aggregation == "fixed_length":
        return terms.sum() / float(terms.shape[0] * terms.shape[1] * max_length)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; choose token_mean, seq_mean or fixed_length")


def token_clipped_loss(
    new, old, ref, advantages: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None,
    aggregation: str = "token_mean", beta: float = 0.0, kl_estimator: str = "k3", max_length: int = 1,
) -> LossOutput:
    """Token-level clipped surrogate (PPO/GRPO, arXiv 2402.03300 eq. 3) over estimator tokens.

    ``ratio = exp(logp_new - logp_old)`` per token and draw, clipped to ``[1 - epsilon, 1 + epsilon_high]``
    (DAPO's clip-higher when ``epsilon_high`` > ``epsilon``), each token's term multiplied by the
    estimator's weight; KL to the reference per token with ``beta``.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.float().view(1, -1, 1)
    ratio = torch.exp(new.logp - old.logp.detach())
    per_token, was_clipped = _clipped(ratio, adv, epsilon, eps_high)
    weight = new.weight
    loss = _aggregate(per_token, weight, aggregation, max_length)
    active = weight != 0
    stats = {
        "clip_frac": float(was_clipped[active].float().mean()) if active.any() else 0.0,
        "ratio_mean": float(ratio.detach()[active].mean()) if active.any() else 1.0,
        "ratio_max_dev": float((ratio.detach()[active] - 1).abs().max()) if active.any() else 0.0,
    }
    if beta and ref is not None:
        kl = kl_estimate(kl_estimator, new.logp, ref.logp.detach())
        kl_term = _aggregate(kl, (weight != 0).float(), aggregation, max_length)
        loss = loss + beta * kl_term
        stats["kl"] = float(kl_term.detach())
    return LossOutput(loss, stats)


def sequence_clipped_loss(
    new, old, ref, advantages: torch.Tensor, *, epsilon: float = 0.2, epsilon_high: float | None = None,
    aggregation: str = "seq_mean", beta: float = 0.0, kl_estimator: str = "k2", max_length: int = 1,
    lengths: torch.Tensor | None = None,
) -> LossOutput:
    """ESPO's sequence-level clipped surrogate (arXiv 2512.03759, eq. 7-9).

    The whole completion is one action with log-likelihood proxy ``E`` (the ELBO estimate,
    ``TokenScores.sequence_score``). ``ratio = exp((E_new - E_old) / L)`` with ``L`` the completion
    length (per-token normalisation), clipped as in PPO; KL at sequence level on ``(E_new - E_ref) / L``.
    ``aggregation`` is unused (one term per sequence; mean over sequences).
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if lengths is None:
        raise ValueError("sequence_clipped_loss needs completion lengths")
    L = lengths.float().clamp(min=1.0)
    e_new, e_old = new.sequence_score(), old.sequence_score().detach()
    ratio = torch.exp((e_new - e_old) / L)
    adv = advantages.float()
    per_seq, was_clipped = _clipped(ratio, adv, epsilon, eps_high)
    loss = per_seq.mean()
    stats = {"clip_frac": float(was_clipped.float().mean()), "ratio_mean": float(ratio.detach().mean()),
             "ratio_max_dev": float((ratio.detach() - 1).abs().max())}
    if beta and ref is not None:
        kl = kl_estimate(kl_estimator, e_new / L, ref.sequence_score().detach() / L).mean()
        loss = loss + beta * kl
        stats["kl"] = float(kl.detach())
    return LossOutput(loss, stats)


POLICY_LOSSES: dict[str, Callable[..., LossOutput]] = {
    "token": token_clipped_loss,
    "sequence": sequence_clipped_loss,
}
