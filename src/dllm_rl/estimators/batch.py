"""The estimators' data types: what is scored (:class:`ScoringBatch`), what is forwarded (:class:`MaskedRows`,
a planner's output) and what comes back (:class:`TokenScores`).

Conventions shared by all estimators:

* The model input of a row is ``[prompt | completion]`` with the prompt left-padded. The prompt is
  clean unless an estimator says otherwise (``mean_field`` masks it at random).
* Every completion column is attended to (rollouts always produce ``G`` tokens); pass
  ``completion_valid`` to hide right padding instead.
* Tokens outside ``completion_mask`` (e.g. the EOS padding after the answer) are never scored and, unless
  ``mask_uncounted=True``, never masked: they stay as clean context. This keeps "where the answer
  ends" visible to the model, as it is in the rollout once those tokens are decoded.
* Image positions of a prompt (``ScoringBatch.images``, LLaDA-V) get their features spliced in every row that
  shows the sample (one per draw / merged step / complement; ``MaskedRows.sample`` says which); they are
  never masked and never scored, and the completion columns are never spliced.
* In every draw each ``(sample, token)`` is scored by at most one row, so ``TokenScores.logp`` is
  well defined; :func:`dllm_rl.estimators.scoring.score_rows` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from dllm_rl.models.prompt_images import PromptImages

if TYPE_CHECKING:
    from dllm_rl.sampling.uniform_rollout import UniformTrace


@dataclass
class ScoringBatch:
    """What an estimator scores: prompts, completions and (for ``trace``) the decoding trace.

    ``prompt_ids``/``prompt_mask`` are ``[B, P]`` and left-padded. ``completion_ids`` is ``[B, G]``;
    ``completion_mask`` marks the tokens that count (the answer up to and including its first EOS).
    ``step_map[b, g]`` is the global decoding step at which completion token ``g`` was committed
    (-1 = never committed). ``completion_valid`` (default: all true) marks completion columns that exist
    at all; False columns are right padding that nothing attends to. ``sample_seeds`` (optional, ``[B]``)
    makes each sample's random masks depend only on the caller's generator and its own seed, not on
    which other samples share the batch — use it when old / reference / current log-probs are computed
    over differently split micro-batches. ``block_size`` (block models) is the block of the layout the tokens
    are scored in: the blocks of the two-stream layout and of the trace, and the block-causal rule of every
    row (``None``: the model's own block; TraceRL's block-size adaptation scores at a larger block than the
    rollout's). Full-attention models ignore it. ``images`` (LLaDA-V, a rollout's ``images``): the image features
    spliced into each prompt, offsets counted in the prompt's real tokens; every row of a sample splices them.
    ``confidence`` (optional, ``[B, G]`` float, a rollout's ``confidence``): each completion token's score when it
    was sampled; MDPO's loss weights its token terms by it (the ``one_step`` estimator hands it on).
    ``entropy`` (optional, ``[B, G]`` float, a rollout's ``entropy``): the model distribution's entropy at each
    completion token's commit (EGSPO's step selection, ``egspo_steps``).
    ``loss_mask`` (optional, ``[B, G]`` bool): the counted tokens that train; the others are drawn and masked as
    the estimator plans but get weight 0 (:func:`~dllm_rl.estimators.plan_rows`), so no loss sees them (IGPO's
    entropy filter on inpainted tokens, :mod:`dllm_rl.rl.inpaint_filter`). ``loss_lengths`` counts the rest.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    step_map: torch.Tensor | None = None
    completion_valid: torch.Tensor | None = None
    sample_seeds: torch.Tensor | None = None
    block_size: int | None = None
    images: PromptImages | None = None
    confidence: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    #: a uniform-state rollout's trajectory (DiffusionGemma, ``Rollout.uniform``): what ``trajectory`` scores
    uniform: UniformTrace | None = None

    def __post_init__(self) -> None:
        self.prompt_mask = self.prompt_mask.bool()
        self.completion_mask = self.completion_mask.bool()
        if self.loss_mask is not None:
            self.loss_mask = self.loss_mask.bool()
        if self.completion_valid is not None:
            self.completion_valid = self.completion_valid.bool()
        self.validate()

    @classmethod
    def from_rollout(cls, rollout: Any) -> ScoringBatch:
        """Build from any object with ``prompt_ids``, ``prompt_mask``, ``completion_ids``,
        ``completion_mask`` and optionally ``step_map`` attributes (``sampling.Rollout`` has them)."""
        missing = [
            k for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask") if not hasattr(rollout, k)
        ]
        if missing:
            raise ValueError(f"ScoringBatch.from_rollout: {type(rollout).__name__} lacks {', '.join(missing)}")
        return cls(
            prompt_ids=rollout.prompt_ids,
            prompt_mask=rollout.prompt_mask,
            completion_ids=rollout.completion_ids,
            completion_mask=rollout.completion_mask,
            step_map=getattr(rollout, "step_map", None),
            completion_valid=getattr(rollout, "completion_valid", None),
            sample_seeds=getattr(rollout, "sample_seeds", None),
            block_size=getattr(rollout, "block_size", None),
            images=getattr(rollout, "images", None),
            confidence=getattr(rollout, "confidence", None),
            entropy=getattr(rollout, "entropy", None),
            uniform=getattr(rollout, "uniform", None),
        )

    # ------------------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return int(self.completion_ids.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def completion_len(self) -> int:
        return int(self.completion_ids.shape[1])

    @property
    def lengths(self) -> torch.Tensor:
        """``L`` per sample: the number of counted completion tokens, ``[B]``."""
        return self.completion_mask.sum(-1)

    @property
    def loss_lengths(self) -> torch.Tensor:
        """``[B]``: the counted tokens that train (``lengths`` within ``loss_mask``), the ``L`` the losses see."""
        if self.loss_mask is None:
            return self.lengths
        return (self.completion_mask & self.loss_mask).sum(-1)

    def input_ids(self) -> torch.Tensor:
        """The clean ``[B, P + G]`` sequences."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def valid(self) -> torch.Tensor:
        """``[B, P + G]`` real-token mask (prompt padding and ``completion_valid`` False are not real)."""
        comp = self.completion_valid if self.completion_valid is not None else torch.ones_like(self.completion_mask)
        return torch.cat([self.prompt_mask, comp], dim=1)

    def image_mask(self) -> torch.Tensor:
        """``[B, P]`` bool: the prompt columns that hold image features (none without ``images``)."""
        if self.images is None:
            return torch.zeros_like(self.prompt_mask)
        starts = self.prompt_len - self.prompt_mask.sum(-1)
        return self.images.mask(starts, self.prompt_len).to(self.prompt_mask.device)

    def select(self, index: torch.Tensor | slice | list[int]) -> ScoringBatch:
        """The sub-batch of the given samples (for micro-batching)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return ScoringBatch(
            pick(self.prompt_ids), pick(self.prompt_mask), pick(self.completion_ids), pick(self.completion_mask),
            pick(self.step_map), pick(self.completion_valid), pick(self.sample_seeds), self.block_size,
            self.images.select(index) if self.images is not None else None, pick(self.confidence), pick(self.entropy),
            pick(self.loss_mask),
            None if self.uniform is None else self.uniform.select(
                index if isinstance(index, slice) else torch.as_tensor(index, device=self.uniform.step.device)),
        )

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first inconsistent field."""
        if self.prompt_ids.dim() != 2 or self.completion_ids.dim() != 2:
            raise ValueError(
                f"ScoringBatch: prompt_ids and completion_ids must be 2-D [B, P] / [B, G], got "
                f"{tuple(self.prompt_ids.shape)} and {tuple(self.completion_ids.shape)}"
            )
        b = self.prompt_ids.shape[0]
        checks = {
            "prompt_mask": (self.prompt_mask, tuple(self.prompt_ids.shape)),
            "completion_ids": (self.completion_ids, (b, self.completion_ids.shape[1])),
            "completion_mask": (self.completion_mask, tuple(self.completion_ids.shape)),
        }
        g_shape = tuple(self.completion_ids.shape)
        for name in ("step_map", "entropy", "completion_valid", "confidence", "loss_mask"):  # optional, [B, G] each
            if getattr(self, name) is not None:
                checks[name] = (getattr(self, name), g_shape)
        if self.sample_seeds is not None:
            checks["sample_seeds"] = (self.sample_seeds, (b,))
        if self.uniform is not None:
            checks["uniform.accepted"] = (self.uniform.accepted, (b, self.uniform.accepted.shape[1], g_shape[1]))
        for name, (t, shape) in checks.items():
            if tuple(t.shape) != shape:
                raise ValueError(f"ScoringBatch: {name} has shape {tuple(t.shape)}, expected {shape}")
        if self.block_size is not None and (isinstance(self.block_size, bool) or int(self.block_size) < 1):
            raise ValueError(f"ScoringBatch: block_size must be None or >= 1, got {self.block_size!r}")
        if self.prompt_ids.is_floating_point() or self.completion_ids.is_floating_point():
            raise ValueError("ScoringBatch: token ids must be integer tensors")
        if self.step_map is not None and self.step_map.is_floating_point():
            raise ValueError("ScoringBatch: step_map must be an integer tensor")
        if self.completion_valid is not None and bool((self.completion_mask & ~self.completion_valid).any()):
            raise ValueError("ScoringBatch: completion_mask marks tokens that completion_valid says do not exist")
        if self.images is not None:
            try:
                self.images.check(self.prompt_mask.sum(-1).tolist())
            except ValueError as err:
                raise ValueError(f"ScoringBatch: images: {err}") from None


@dataclass
class TokenScores:
    """Per-token log-probs and weights of ``D`` draws: ``logp``/``weight`` are float32 ``[D, B, G]``.

    ``logp[d, b, g]`` is ``log p(token g | the masked state of draw d)`` where ``weight[d, b, g] != 0``
    and 0 elsewhere. ``forwards`` counts sequences (rows) pushed through the model; ``forward_tokens``
    the total columns of those rows (a two-stream row is ``prompt + 2 x response`` long); ``calls`` the
    model invocations (rows are batched ``max_rows`` at a time). ``info`` holds estimator-specific
    tensors (e.g. ``mask_ratio`` or ``num_masked``) for logging and tests.
    """

    logp: torch.Tensor
    weight: torch.Tensor
    forwards: int
    forward_tokens: int = 0
    calls: int = 0
    info: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_draws(self) -> int:
        return int(self.logp.shape[0])

    def sequence_score(self) -> torch.Tensor:
        """``[B]``: mean over draws of ``sum_g weight * logp`` — with ``elbo`` the Monte-Carlo ELBO, ESPO's
        sequence log-likelihood proxy (arXiv 2512.03759), with ``trace`` TraceRL's trace log-likelihood."""
        return (self.weight * self.logp).sum(-1).mean(0)

    def token_score(self) -> torch.Tensor:
        """``[B, G]``: mean over draws of ``weight * logp`` — the per-token log-likelihood proxy that
        token-level losses (diffu-GRPO, coupled-GRPO, UniGRPO, TraceRL) put into their ratios."""
        return (self.weight * self.logp).mean(0)

    def scored(self) -> torch.Tensor:
        """``[D, B, G]`` bool: which tokens were scored in each draw."""
        return self.weight != 0


@dataclass
class MaskedRows:
    """The rows an estimator forwards (the output of a planner).

    ``input_ids``/``valid`` are ``[R, P + G]``: the masked sequence of each row. With ``clean_ids`` set
    (block models), a row is run in the two-stream layout ``[prompt | clean | noisy copy]`` whose noisy
    copy is ``input_ids``. With ``causal`` (the ``ar`` estimator) rows run under a causal mask and token
    ``g`` is read from the logits that predict the next token at the column before it.
    ``draw``/``sample`` (``[R]``) say where the row's scores go; ``weight`` (``[R, G]``, float32) is each
    completion token's weight in that row (0 = not scored); ``targets`` (``[B, G]``) are the clean
    completion tokens the scored positions must predict. ``block_size``: the block of a block model's layout
    (the scored batch's, resolved: :meth:`~dllm_rl.models.DiffusionLM.layout_block`); ``None`` for full attention.
    ``images``: the scored batch's (per sample); row ``r`` splices sample ``sample[r]``'s image features at its
    prompt columns.
    """

    input_ids: torch.Tensor
    valid: torch.Tensor
    draw: torch.Tensor
    sample: torch.Tensor
    weight: torch.Tensor
    targets: torch.Tensor
    num_draws: int
    batch_size: int
    prompt_len: int
    clean_ids: torch.Tensor | None = None
    prompt_lengths: torch.Tensor | None = None
    causal: bool = False
    info: dict[str, torch.Tensor] = field(default_factory=dict)
    block_size: int | None = None
    images: PromptImages | None = None

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_len(self) -> int:
        return int(self.weight.shape[1])
