"""SFT objectives for diffusion LMs: each one a registered estimator, reduced by one loss rule.

Every objective scores the batch with :func:`dllm_rl.estimators.estimate` (per-token float32 log-probs and
weights, ``[D, B, G]``) and is reduced by the one rule of :func:`sequence_loss`:

    loss = mean_b  mean_d  ( - sum_g weight[d,b,g] * logp[d,b,g] ) / L_b,      L_b = response length of b

(LLaDA's SFT normalisation, arXiv 2502.09992 Eq. 5 and its released code: the per-sequence sum divided by
the answer length, averaged over the batch). The prompt is never masked or scored.

=============  ==========================================================================================
``random_mask`` MDLM / LLaDA SFT: the ``random_mask`` estimator with ``lo=eps, hi=1, importance_weight``
``block``       block diffusion SFT, the ``block`` estimator. Block models: one noise level per block, every
                block trained in one two-stream forward (SDAR / BD3-LM). Full attention: the sliced form
``trace``       TraceRL's trajectory replay (arXiv 2509.06949 Eq. 4 with unit advantages): the ``trace``
                estimator over recorded step maps
``ar``          next-token cross-entropy under a causal mask, the ``ar`` estimator
``uniform``     uniform-state families (DiffusionGemma): the published denoising cross-entropy with two-pass
                self-conditioning, canvas by canvas (the ``uniform_denoise`` estimator)
``certainty_forcing`` dParallel's certainty-forcing self-distillation (arXiv 2509.26488) on the model's own right
                answers: masked CE plus the entropy of the already-right predictions (:mod:`dllm_rl.sft.certainty`;
                its own reduction, not :func:`sequence_loss`)
=============  ==========================================================================================

An objective trains the noise kind of its estimator (:data:`dllm_rl.estimators.NOISE`); :func:`check_objective`
refuses it on a family of the other kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal

import torch

from dllm_rl.config import Checked, ConfigError, field
from dllm_rl.estimators import NOISE, ScoringBatch, TokenScores, estimate
from dllm_rl.models import DiffusionLM
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE


@dataclass
class ObjectiveConfig(Checked):
    """Which SFT loss, and its knobs."""

    name: Literal["random_mask", "block", "trace", "ar", "uniform", "certainty_forcing"] = field(
        "random_mask", help="random_mask (MDLM/LLaDA), block (block diffusion / semi-AR), trace (TraceRL "
        "trajectory replay, needs step maps), ar (next-token loss for AR-adapted full-attention models), uniform "
        "(uniform-state families such as diffusion_gemma: the published denoising cross-entropy, canvas by canvas), "
        "certainty_forcing (dParallel: masked CE plus the entropy of the already-right predictions, on the model's "
        "own right answers; docs/methods.md)")
    eps: float = field(
        1e-3, gt=0, lt=1, help="noise levels t ~ U(eps, 1) (MDLM/LLaDA eps; keeps the 1/t weight bounded)")
    num_mc: int = field(1, ge=1, help="random_mask, uniform: noisy draws per sequence (Monte-Carlo samples of t)")
    self_conditioning_p: float = field(
        0.5, ge=0, le=1, help="uniform: probability per example and canvas that a no-grad first pass's logits are "
        "fed to the scored pass as self-conditioning (NeMo's DiffusionGemma SFT recipe: 0.5)")
    block_size: int | None = field(
        None, ge=1, help="block objective: block length. Block models: null = the model's block_size (must match). "
        "Full-attention models: the semi-AR decoding block_length (required)")
    shrinkage: int = field(1, ge=1, help="trace objective: TraceRL shrinkage s (merge every s decoding steps)")
    mask_ratio: float = field(0.5, gt=0, lt=1, help="certainty_forcing: probability that a token of the drawn block "
                              "is masked (dParallel's released code: 0.5)")
    certainty_weight: float = field(2.0, ge=0, help="certainty_forcing: beta, the weight of the certainty (entropy) "
                                    "term against the masked CE (dParallel's released code: 2)")
    certainty_temperature: float = field(0.5, gt=0, help="certainty_forcing: T, the softmax temperature of the "
                                         "entropy (dParallel's released code: 0.5)")
    complement: bool = field(True, help="certainty_forcing: also score the drawn block's complementary mask (every "
                             "token of the block scored once)")
    max_rows: int | None = field(None, ge=1, help="forward at most this many masked rows at once (memory bound)")
    logprob_chunk_size: int = field(
        DEFAULT_CHUNK_SIZE, ge=0, help="scored positions the LM head projects onto the vocabulary at a time, "
        "recomputed "
        "in backward (memory independent of the vocabulary; 0 = all at once)")

    def options(self) -> dict[str, Any]:
        """The keyword options :func:`compute_objective` passes to this objective."""
        scorer = {"max_rows": self.max_rows, "logprob_chunk_size": self.logprob_chunk_size}
        if self.name == "random_mask":
            return {"eps": self.eps, "num_mc": self.num_mc, **scorer}
        if self.name == "block":
            return {"eps": self.eps, "block_size": self.block_size, **scorer}
        if self.name == "trace":
            return {"shrinkage": self.shrinkage, **scorer}
        if self.name == "certainty_forcing":
            return {"block_size": self.block_size, "mask_ratio": self.mask_ratio, "weight": self.certainty_weight,
                    "temperature": self.certainty_temperature, "complement": self.complement,
                    "logprob_chunk_size": self.logprob_chunk_size}  # (projects whole answers: unused)
        if self.name == "uniform":  # decoded canvas by canvas: no rows to bound with max_rows
            return {"eps": self.eps, "num_mc": self.num_mc, "self_conditioning_p": self.self_conditioning_p,
                    "logprob_chunk_size": self.logprob_chunk_size}
        return scorer


def sequence_loss(scores: TokenScores, lengths: torch.Tensor) -> torch.Tensor:
    """Scalar float32 loss ``mean_b mean_d (-sum_g w*logp) / L_b`` (LLaDA Eq. 5 normalisation)."""
    per_seq = -(scores.weight * scores.logp).sum(-1).mean(0)  # [B]
    return (per_seq / lengths.to(per_seq.device).clamp(min=1).float()).mean()


OBJECTIVES = ("random_mask", "block", "trace", "ar", "uniform", "certainty_forcing")
_ESTIMATOR_OF = {"random_mask": "random_mask", "uniform": "uniform_denoise"}  # the others run their namesake
#: the noise kind of an objective that runs no estimator
_NOISE_OF = {"certainty_forcing": "mask"}


def _noise(name: str) -> str:
    return _NOISE_OF.get(name) or NOISE[_ESTIMATOR_OF.get(name, name)]


def check_objective(name: str, family) -> None:
    """Refuse SFT objective ``name`` on a model of ``family`` whose noise kind its estimator does not train
    (:class:`ConfigError`, one line naming ``objective.name`` and the objectives that fit)."""
    kind = _noise(name)
    if kind != family.noise:
        fits = ", ".join(n for n in OBJECTIVES if _noise(n) == family.noise)
        words = {"mask": "masked", "uniform": "uniform-state"}
        raise ConfigError(f"objective.name={name} trains {words[kind]} diffusion; {family.name} is "
                          f"{words[family.noise]}: use objective.name={fits}")


def objective_estimator(name: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The estimator and its options that SFT objective ``name`` runs. ``random_mask`` is MDLM / LLaDA SFT
    (LLaDA arXiv 2502.09992 Eq. 5): noise levels ``t ~ U(eps, 1)`` and weight ``1/t`` on masked tokens."""
    if name == "random_mask":
        opts = dict(options)
        eps = opts.pop("eps", 1e-3)
        return "random_mask", {"lo": eps, "hi": 1.0, "importance_weight": True, **opts}
    return _ESTIMATOR_OF.get(name, name), dict(options)


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor
    scores: TokenScores | None  # None: an objective that runs no estimator (certainty_forcing)
    scored_tokens: int
    metrics: dict[str, float] = dataclass_field(default_factory=dict)  # its parts, averaged over a step


def compute_objective(
    name: str, model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *,
    agree_calls: Callable[[int], int] | None = None, **options: Any
) -> ObjectiveOutput:
    """Run objective ``name`` (its estimator, see :func:`objective_estimator`) and reduce it with
    :func:`sequence_loss`. ``agree_calls``: the ranks' agreement on the number of forwards under FSDP2 /
    ZeRO-3 (:func:`dllm_rl.training.ranks.forward_agreement`; every rank calls this for each micro-batch)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown SFT objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    if name == "certainty_forcing":
        from dllm_rl.sft.certainty import certainty_forcing

        loss, scored, metrics = certainty_forcing(model, batch, generator, **options)
        return ObjectiveOutput(loss=loss, scores=None, scored_tokens=scored, metrics=metrics)
    if name == "trace" and batch.step_map is None:
        raise ValueError("the trace objective needs step maps (a data column from `dllm-rl generate --trace`)")
    estimator, opts = objective_estimator(name, options)
    scores = estimate(model, estimator, batch, generator, agree_calls=agree_calls, **opts)
    loss = sequence_loss(scores, batch.lengths)
    if torch.is_grad_enabled() and not loss.requires_grad:
        # Nothing was masked in this micro-batch (small t, short responses), so no row was forwarded. Run the
        # clean batch once with a zero weight: backward stays legal and DDP ranks stay in step (the LM head
        # projects one column per row, never [B, T, V]).
        out = model(input_ids=batch.input_ids().to(model.device), attention_mask=batch.valid().to(model.device),
                    logits_to_keep=1)
        loss = loss + 0.0 * out.logits.float().mean()
    return ObjectiveOutput(loss=loss, scores=scores, scored_tokens=int(scores.scored().sum().item()))
