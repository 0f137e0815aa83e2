"""Policy losses, registered by name in :data:`POLICY_LOSSES` (verl's ``core_algos`` style).

Every loss has one signature, ``loss(new, old, ref, advantages, lengths, config) -> LossOutput``: the
estimator outputs (``TokenScores``: per-draw, per-token ``logp`` and ``weight``) of the current, old and
reference policy (``ref`` may be ``None``), advantages ``[B]`` (or ``[B, G]`` per token: token loss only),
completion lengths ``L`` ``[B]`` and the loss
settings :class:`LossConfig` (built from the RL config by :meth:`LossConfig.from_rl_config`). A new policy
loss is one such function registered with ``@register_loss("name")`` (in its method's module,
:mod:`dllm_rl.rl.methods`); its own settings come from ``config.options`` (the RL config's ``loss_options``).

A loss declares its facts when it is registered (``@register_loss(name, kl_level=..., draw_by_draw=...,
ratio_free=...)``), kept as the typed fields of its :class:`PolicyLoss` in :data:`POLICY_LOSSES`:

* ``kl_level``: where the KL to the reference applies, ``"token"`` (per token, reduced as the loss's token terms
  are), ``"sequence"`` (on the length-normalised sequence scores) or ``"draw"`` (on each draw's summed scores, one
  action per draw: EGSPO's denoising steps), or ``None`` (the loss defines none: ``beta`` must be 0). No loss adds
  a KL itself: :func:`policy_objective` adds ``beta * KL`` once, at that level (as verl adds its KL loss outside
  the policy loss).
* ``draw_by_draw``: the trainer back-propagates the loss one Monte-Carlo draw at a time (BGPO, EBPO: many draws),
  with the exact gradient of any loss, so the memory of an update does not grow with the number of draws
  (:mod:`dllm_rl.rl.draw_backward`).
* ``ratio_free``: the loss has no importance ratio (SPG, wd1). Every other loss reports ``ratio_max_dev`` (the
  largest ``|ratio - 1|`` of its terms) in its statistics, which the update checks at the first micro-batch of
  a step (common random numbers make it exactly 0 there); a loss with a ratio that reports none is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.kl import KL_ESTIMATORS, kl_estimate


@dataclass
class LossOutput:
    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def _token_mean(terms: torch.Tensor, active: torch.Tensor, max_length: int) -> torch.Tensor:
    """Sum over all scored tokens / their count (DAPO's token-level loss, arXiv 2503.14476 Eq. 8)."""
    return terms.sum() / active.sum().clamp(min=1.0)


def _seq_mean(terms: torch.Tensor, active: torch.Tensor, max_length: int) -> torch.Tensor:
    """Per-sequence mean, then mean over the sequences that have a scored token (GRPO, arXiv 2402.03300 Eq. 3)."""
    per_seq = terms.sum(-1) / active.sum(-1).clamp(min=1.0)  # [D, B]
    has = (active.sum(-1) > 0).float()
    return (per_seq * has).sum() / has.sum().clamp(min=1.0)


def _fixed_length(terms: torch.Tensor, active: torch.Tensor, max_length: int) -> torch.Tensor:
    """Sum / (draws x sequences x ``max_length``) (Dr. GRPO, arXiv 2503.20783, its unbiased-loss section)."""
    return terms.sum() / float(terms.shape[0] * terms.shape[1] * max_length)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean": _seq_mean,
    "fixed_length": _fixed_length,
}


@dataclass(frozen=True)
class LossConfig:
    """The policy-loss settings (TRL names where they exist): the clip range ``[1 - epsilon, 1 + epsilon_high]``,
    the token-term ``aggregation`` (a name in :data:`AGGREGATIONS`; the sequence loss has one term per
    sequence), the KL coefficient ``beta`` and ``kl_estimator`` (a name in
    :data:`dllm_rl.rl.kl.KL_ESTIMATORS`), ``max_length`` (``fixed_length``'s divisor: the completion
    columns of the batch), ``options``, the settings of one loss (``loss_options``, e.g. SPG's
    ``eubo_beta``; each loss reads and checks its own) and ``progress``, the training progress in [0, 1]
    (``step / train.max_steps``) for losses whose terms follow a schedule (d-TreeRPO's self-distillation)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None
    aggregation: str = "token_mean"
    beta: float = 0.0
    kl_estimator: str = "k3"
    max_length: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    progress: float = 0.0

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown loss aggregation {self.aggregation!r}; choose "
                             f"{', '.join(AGGREGATIONS)} (loss_aggregation)")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ValueError(f"epsilon and epsilon_high must be >= 0, got {self.epsilon} and {self.epsilon_high}")
        if self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")

    @property
    def clip_high(self) -> float:
        """The upper clip range: ``epsilon_high``, or ``epsilon`` when unset."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @classmethod
    def from_rl_config(cls, cfg: Any, max_length: int, progress: float = 0.0) -> LossConfig:
        """The loss settings of a resolved ``RLConfig`` (the one place they are read from it) at ``progress``."""
        return cls(epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, aggregation=cfg.loss_aggregation,
                   beta=cfg.beta, kl_estimator=cfg.kl_estimator, max_length=max_length,
                   options=dict(getattr(cfg, "loss_options", None) or {}), progress=progress)

    def option(self, name: str, default: Any) -> Any:
        """Loss option ``name`` (from ``loss_options``), or ``default``."""
        return self.options.get(name, default)


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A), was_clipped)``: PPO's clipped
    surrogate (arXiv 1707.06347 Eq. 7) as a loss, with DAPO's decoupled clip-higher range (arXiv 2503.14476)."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    obj = torch.minimum(unclipped, clipped)
    was_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    return -obj, was_clipped


def token_clipped_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """Token-level clipped surrogate over estimator tokens (PPO arXiv 1707.06347 Eq. 7 per token, as GRPO
    arXiv 2402.03300 Eq. 3 uses it; diffu-GRPO, coupled-GRPO, UniGRPO and TraceRL put their estimators'
    per-token log-likelihoods in it).

    ``ratio = exp(logp_new - logp_old)`` per token and draw, clipped to ``[1 - epsilon, 1 + epsilon_high]``
    (DAPO's clip-higher when ``epsilon_high`` > ``epsilon``), each token's term multiplied by the
    estimator's weight and reduced by ``config.aggregation`` (KL: per token, :func:`policy_objective`).
    ``lengths`` is not used (the token weights say which tokens count). ``advantages`` is ``[B]`` (one per
    sample) or ``[B, G]`` (one per completion token: the value model's GAE advantages, :mod:`dllm_rl.rl.value`).
    """
    adv = advantages.float().view(1, -1, 1) if advantages.dim() == 1 else advantages.float()[None]
    ratio = torch.exp(new.logp - old.logp.detach())
    per_token, was_clipped = clipped_surrogate(ratio, adv, config.epsilon, config.clip_high)
    weight = new.weight
    active = weight != 0
    aggregate = AGGREGATIONS[config.aggregation]
    loss = aggregate(weight * per_token, active.float(), config.max_length)
    stats = {
        "clip_frac": float(was_clipped[active].float().mean()) if active.any() else 0.0,
        "ratio_mean": float(ratio.detach()[active].mean()) if active.any() else 1.0,
        "ratio_max_dev": float((ratio.detach()[active] - 1).abs().max()) if active.any() else 0.0,
    }
    return LossOutput(loss, stats)


def sequence_clipped_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """ESPO's sequence-level clipped surrogate (arXiv 2512.03759, eq. 7-9).

    The whole completion is one action with log-likelihood proxy ``E`` (the ELBO estimate,
    ``TokenScores.sequence_score``). ``ratio = exp((E_new - E_old) / L)`` with ``L`` the completion
    length (ESPO's per-token normalisation of the sequence ratio), clipped as in PPO (arXiv 1707.06347 Eq. 7);
    KL at sequence level (:func:`policy_objective`: ``(E_new - E_ref) / L``; ESPO uses k2).
    ``config.aggregation`` is unused (one term per sequence; mean over sequences).
    """
    if advantages.dim() != 1:
        raise ValueError(f"the sequence loss takes one advantage per sample ([B]), got shape "
                         f"{tuple(advantages.shape)}; per-token advantages (value_model) need loss_type=token")
    L = lengths.float().clamp(min=1.0)
    e_new, e_old = new.sequence_score(), old.sequence_score().detach()
    ratio = torch.exp((e_new - e_old) / L)
    per_seq, was_clipped = clipped_surrogate(ratio, advantages.float(), config.epsilon, config.clip_high)
    loss = per_seq.mean()
    stats = {"clip_frac": float(was_clipped.float().mean()), "ratio_mean": float(ratio.detach().mean()),
             "ratio_max_dev": float((ratio.detach() - 1).abs().max())}
    return LossOutput(loss, stats)


LossFunction = Callable[[TokenScores, TokenScores, TokenScores | None, torch.Tensor, torch.Tensor, LossConfig],
                        LossOutput]
KL_LEVELS = ("token", "sequence", "draw")


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its ``name``, function ``fn`` and the facts the trainer reads (the module
    docstring). Calling it calls ``fn``."""

    name: str
    fn: LossFunction
    kl_level: str | None
    draw_by_draw: bool = False
    ratio_free: bool = False

    def __post_init__(self) -> None:
        if self.kl_level is not None and self.kl_level not in KL_LEVELS:
            raise ValueError(f"policy loss {self.name!r}: kl_level is one of {', '.join(KL_LEVELS)} or None, got "
                             f"{self.kl_level!r}")

    def __call__(self, new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor,
                 lengths: torch.Tensor, config: LossConfig) -> LossOutput:
        return self.fn(new, old, ref, advantages, lengths, config)


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_loss(name: str, *, kl_level: str | None, draw_by_draw: bool = False,
                  ratio_free: bool = False) -> Callable[[LossFunction], LossFunction]:
    """``@register_loss("name", kl_level=...)``: file the function as policy loss ``name`` in :data:`POLICY_LOSSES`
    (a :class:`PolicyLoss` with the facts the trainer reads, the module docstring) and return it unchanged; a name
    registered twice raises ``ValueError``."""
    def deco(fn: LossFunction) -> LossFunction:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} registered twice")
        POLICY_LOSSES[name] = PolicyLoss(name, fn, kl_level, draw_by_draw, ratio_free)  # checks the facts
        return fn

    return deco


register_loss("token", kl_level="token")(token_clipped_loss)
register_loss("sequence", kl_level="sequence")(sequence_clipped_loss)


def kl_penalty(level: str, new: TokenScores, ref: TokenScores, lengths: torch.Tensor, config: LossConfig
               ) -> torch.Tensor:
    """The KL of the current policy to the reference (``config.kl_estimator``) at ``level``: ``token``, per scored
    token (weight != 0), reduced by ``config.aggregation`` as the token terms are (GRPO, arXiv 2402.03300 Eq. 3);
    ``sequence``, on the sequence scores divided by the completion length ``L``, mean over sequences (ESPO, arXiv
    2512.03759); ``draw``, on each (draw, sample)'s weighted sum of scores, mean over those with a scored token
    (EGSPO's step-level k3, arXiv 2603.12554)."""
    if level == "draw":
        cell = (new.weight != 0).any(-1).float()
        kl = kl_estimate(config.kl_estimator, (new.weight * new.logp).sum(-1), (ref.weight * ref.logp.detach()).sum(-1))
        return (kl * cell).sum() / cell.sum().clamp(min=1.0)
    if level == "token":
        active = (new.weight != 0).float()
        kl = kl_estimate(config.kl_estimator, new.logp, ref.logp.detach())
        return AGGREGATIONS[config.aggregation](active * kl, active, config.max_length)
    L = lengths.float().clamp(min=1.0)
    return kl_estimate(config.kl_estimator, new.sequence_score() / L, ref.sequence_score().detach() / L).mean()


def policy_objective(
    loss: PolicyLoss, new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor,
    lengths: torch.Tensor, config: LossConfig,
) -> LossOutput:
    """What the trainer back-propagates: ``loss``'s value plus ``beta * KL`` at its ``kl_level`` (the one place a KL
    is added; statistic ``kl``). A loss without a KL level refuses ``beta > 0``."""
    out = loss(new, old, ref, advantages, lengths, config)
    if not config.beta:
        return out
    if loss.kl_level is None:
        raise ValueError(f"the {loss.name!r} loss defines no KL term: set beta=0")
    if ref is None:
        return out
    kl = kl_penalty(loss.kl_level, new, ref, lengths, config)
    return LossOutput(out.loss + config.beta * kl, {**out.stats, "kl": float(kl.detach())})


def check_options(config: LossConfig, loss: str, valid: tuple[str, ...]) -> None:
    """Raise ``ValueError`` when ``config.options`` holds a key that loss ``loss`` does not read."""
    unknown = sorted(set(config.options) - set(valid))
    if unknown:
        raise ValueError(f"loss_options: {', '.join(unknown)} not read by the {loss!r} loss; valid: "
                         f"{', '.join(valid) or '(none)'}")
