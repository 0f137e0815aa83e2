"""Shared pieces of the log-likelihood estimators: batch and score types, the row runner, the registry.

Every estimator works in two halves:

1. a *planner* turns ``(model, batch, generator, **options)`` into :class:`MaskedRows` — the masked
   sequences to forward, and for each row which draw / sample it belongs to and the weight of each
   completion token in it (0 = not scored). All randomness is drawn here, from the caller's generator
   only, before any forward, so the masks do not depend on ``max_rows`` or on the model;
2. :func:`score_rows` runs the rows through the model in chunks of ``max_rows``, takes the float32
   log-softmax at the scored positions only, and scatters them into :class:`TokenScores`.

An estimator is one function ``f(model, batch, generator, *, option=..., max_rows=None) -> TokenScores``
registered by name in :data:`ESTIMATORS` (verl's ``core_algos`` style); :func:`estimate` looks it up and
checks the options. :func:`estimator_forwards` runs only the planner, so a cost benchmark can count
forwards without running the model.

Conventions shared by all estimators:

* The model input of a row is ``[prompt | completion]`` with the prompt left-padded. The prompt is
  clean unless an estimator says otherwise (``mean_field`` masks it at random).
* Every completion column is attended to (rollouts always produce ``G`` tokens); pass
  ``completion_valid`` to hide right padding instead.
* Tokens outside ``completion_mask`` (e.g. the EOS padding after the answer) are never scored and, unless
  ``mask_uncounted=True``, never masked: they stay as clean context. This keeps "where the answer
  ends" visible to the model, as it is in the rollout once those tokens are decoded.
* In every draw each ``(sample, token)`` is scored by at most one row, so ``TokenScores.logp`` is
  well defined; :func:`score_rows` checks it.
* Block models (``model.is_block_causal``) score every row in the two-stream layout (noisy copy of the
  completion next to the clean sequence, :func:`dllm_rl.models.masks.two_stream_layout`): a token of block
  ``j`` sees the prompt, *clean* blocks ``< j`` and the masked state of its own block, which is the only
  context the block sampler ever gives it. (A single masked sequence would show later blocks masked
  earlier blocks, a state the sampler never produces.)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import block_index, position_ids_from_valid, two_stream_layout

# --------------------------------------------------------------------------------------------------
# Batch and result types


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
    over differently split micro-batches.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    step_map: torch.Tensor | None = None
    completion_valid: torch.Tensor | None = None
    sample_seeds: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.prompt_mask = self.prompt_mask.bool()
        self.completion_mask = self.completion_mask.bool()
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

    def input_ids(self) -> torch.Tensor:
        """The clean ``[B, P + G]`` sequences."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def valid(self) -> torch.Tensor:
        """``[B, P + G]`` real-token mask (prompt padding and ``completion_valid`` False are not real)."""
        comp = self.completion_valid if self.completion_valid is not None else torch.ones_like(self.completion_mask)
        return torch.cat([self.prompt_mask, comp], dim=1)

    def select(self, index: torch.Tensor | slice | list[int]) -> ScoringBatch:
        """The sub-batch of the given samples (for micro-batching)."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return ScoringBatch(
            pick(self.prompt_ids), pick(self.prompt_mask), pick(self.completion_ids), pick(self.completion_mask),
            pick(self.step_map), pick(self.completion_valid), pick(self.sample_seeds),
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
        if self.step_map is not None:
            checks["step_map"] = (self.step_map, tuple(self.completion_ids.shape))
        if self.completion_valid is not None:
            checks["completion_valid"] = (self.completion_valid, tuple(self.completion_ids.shape))
        if self.sample_seeds is not None:
            checks["sample_seeds"] = (self.sample_seeds, (b,))
        for name, (t, shape) in checks.items():
            if tuple(t.shape) != shape:
                raise ValueError(f"ScoringBatch: {name} has shape {tuple(t.shape)}, expected {shape}")
        if self.prompt_ids.is_floating_point() or self.completion_ids.is_floating_point():
            raise ValueError("ScoringBatch: token ids must be integer tensors")
        if self.step_map is not None and self.step_map.is_floating_point():
            raise ValueError("ScoringBatch: step_map must be an integer tensor")
        if self.completion_valid is not None and bool((self.completion_mask & ~self.completion_valid).any()):
            raise ValueError("ScoringBatch: completion_mask marks tokens that completion_valid says do not exist")


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
        """``[B]``: mean over draws of ``sum_g weight * logp`` (e.g. the Monte-Carlo ELBO)."""
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
    (block models, ``trace``), a row is run in the two-stream layout ``[prompt | clean | noisy copy]``
    whose noisy copy is ``input_ids``. ``draw``/``sample`` (``[R]``) say where the row's scores go;
    ``weight`` (``[R, G]``, float32) is each completion token's weight in that row (0 = not scored);
    ``targets`` (``[B, G]``) are the clean completion tokens the scored positions must predict.
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
    info: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_len(self) -> int:
        return int(self.weight.shape[1])


# --------------------------------------------------------------------------------------------------
# Randomness: only the caller's generator


class RowRandom:
    """Uniform draws of shape ``[B, *shape]`` from the caller's generator only.

    Without ``batch.sample_seeds`` this is ``torch.rand((B, *shape), generator=generator)``. With them,
    one base seed is drawn from ``generator`` and each sample gets its own generator seeded from
    ``(base, sample_seed)``, so a sample's draws do not depend on the rest of the batch. Numbers are drawn
    on the generator's device (CPU generators work with GPU models).
    """

    def __init__(self, generator: torch.Generator, batch: ScoringBatch):
        if not isinstance(generator, torch.Generator):
            raise ValueError(
                f"estimators need an explicit torch.Generator (got {type(generator).__name__}); the global RNG "
                "is never used so that old / reference / current policies see the same masks"
            )
        self.generator = generator
        self.batch_size = batch.batch_size
        self.per_sample: list[torch.Generator] | None = None
        if batch.sample_seeds is not None:
            base = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            self.per_sample = []
            for s in batch.sample_seeds.tolist():
                g = torch.Generator(device=generator.device)
                g.manual_seed((base * 6364136223846793005 + int(s) * 1442695040888963407 + 1) % (2**63))
                self.per_sample.append(g)

    def rand(self, *shape: int) -> torch.Tensor:
        dev = self.generator.device
        if self.per_sample is None:
            return torch.rand((self.batch_size, *shape), generator=self.generator, device=dev)
        if not self.per_sample:
            return torch.empty((0, *shape), device=dev)
        return torch.stack([torch.rand(shape, generator=g, device=dev) for g in self.per_sample])


# --------------------------------------------------------------------------------------------------
# Running rows through the model


def _forward_rows(
    model: DiffusionLM, rows: MaskedRows, idx: torch.Tensor, device: torch.device, scored: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Run rows ``idx`` and return ``(logits, col, width)``: ``col[r, g]`` is the logits column that scores
    completion token ``g`` of row ``r`` (-1: none) and ``width`` the number of model input columns.

    Scored tokens always sit in the last columns of the model input (the completion of ``[prompt |
    completion]``, or the noisy stream of the two-stream layout), so the LM head is asked only for the
    columns from the first scored one to the end (``logits_to_keep``); ``scored`` (``[r, G]`` bool) says
    which tokens are scored.
    """
    ids = rows.input_ids[idx].to(device)
    valid = rows.valid[idx].to(device)
    p, g = rows.prompt_len, rows.completion_len
    if rows.clean_ids is None:
        inputs = {"input_ids": ids, "attention_mask": valid}
        col = torch.arange(p, p + g, device=device).expand(ids.shape[0], -1)
    else:
        if model.family.shift:
            raise ValueError("the two-stream layout is for block models without a logit shift")
        layout = two_stream_layout(
            rows.clean_ids[idx].to(device), ids, valid, rows.prompt_lengths[idx].to(device), int(model.block_size),
            pad_token_id=model.pad_token_id, dtype=model.dtype,
        )
        inputs = {"input_ids": layout.input_ids, "position_ids": layout.position_ids, "attn_bias": layout.bias}
        seq = layout.seq_len
        # noisy slot j copies original column noisy_columns[r, j]; invert that map for the completion columns.
        slot_of = torch.full((ids.shape[0], seq), -1, dtype=torch.long, device=device)
        r_idx, j_idx = torch.nonzero(layout.noisy_columns >= 0, as_tuple=True)
        slot_of[r_idx, layout.noisy_columns[r_idx, j_idx]] = j_idx
        comp_slot = slot_of[:, p:]
        # Every valid response column has a noisy copy; invalid (right-padding) columns get -1 (never scored).
        col = torch.where(comp_slot >= 0, seq + comp_slot, -1)
    width = int(inputs["input_ids"].shape[1])
    scored_cols = col[scored]
    if bool((scored_cols < 0).any()):
        raise RuntimeError("a scored completion token has no output column (scored a non-existent token?)")
    first = int(scored_cols.min().item()) if scored_cols.numel() else width - 1
    out = model(**inputs, logits_to_keep=width - first)
    return out.logits, torch.where(col >= first, col - first, -1), width


def score_rows(model: DiffusionLM, rows: MaskedRows, max_rows: int | None = None) -> TokenScores:
    """Forward ``rows`` (``max_rows`` at a time) and gather float32 log-probs of the scored tokens.

    Only rows with a non-zero weight are run. The LM head projects only the columns from a chunk's first
    scored column to the end (``logits_to_keep``: the completion, or the two-stream noisy copy), and the
    log-softmax is taken in float32 over the scored positions only (``[N, V]``, not ``[R, G, V]``).
    Gradients flow to the model through ``logp`` when called under grad (every chunk's graph is kept until
    backward: ``max_rows`` bounds the logits held at once, micro-batch the :class:`ScoringBatch` to bound
    training memory).
    """
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
    device = model.device
    d_n, b_n, g_n = rows.num_draws, rows.batch_size, rows.completion_len
    weight_rows = rows.weight.float()
    live = torch.nonzero(weight_rows.ne(0).any(-1), as_tuple=True)[0]
    r_sel, g_sel = torch.nonzero(weight_rows.ne(0), as_tuple=True)
    d_sel, b_sel = rows.draw[r_sel], rows.sample[r_sel]
    count = torch.zeros(d_n, b_n, g_n, dtype=torch.long)
    count.index_put_((d_sel.cpu(), b_sel.cpu(), g_sel.cpu()), torch.ones_like(g_sel.cpu()), accumulate=True)
    if int(count.max().item() if count.numel() else 0) > 1:
        raise RuntimeError("estimator plan scores a token twice in one draw")
    weight = torch.zeros(d_n, b_n, g_n, dtype=torch.float32, device=device)
    weight[d_sel.to(device), b_sel.to(device), g_sel.to(device)] = weight_rows[r_sel, g_sel].to(device)

    values: list[torch.Tensor] = []
    where: list[torch.Tensor] = []
    calls = 0
    tokens = 0
    chunk = len(live) if max_rows is None else max_rows
    for start in range(0, len(live), max(chunk, 1)):
        idx = live[start : start + chunk]
        w = weight_rows[idx].to(device)
        logits, col, width = _forward_rows(model, rows, idx, device, w.ne(0))
        calls += 1
        tokens += int(logits.shape[0] * width)
        rr, gg = torch.nonzero(w.ne(0), as_tuple=True)
        out_col = col[rr, gg]
        picked = logits[rr, out_col].float()
        sample = rows.sample[idx].to(device)
        target = rows.targets[rows.sample[idx]].to(device)[rr, gg]
        lp = torch.log_softmax(picked, dim=-1).gather(-1, target[:, None]).squeeze(-1)
        values.append(lp)
        where.append(torch.stack([rows.draw[idx].to(device)[rr], sample[rr], gg]))
    logp = torch.zeros(d_n, b_n, g_n, dtype=torch.float32, device=device)
    if values:
        pos = torch.cat(where, dim=1)
        logp = logp.index_put((pos[0], pos[1], pos[2]), torch.cat(values))
    return TokenScores(
        logp=logp, weight=weight, forwards=len(live), forward_tokens=tokens, calls=calls,
        info={k: v.to(device) for k, v in rows.info.items()},
    )


# --------------------------------------------------------------------------------------------------
# Shared masking helpers


def build_rows(
    batch: ScoringBatch,
    sample: torch.Tensor,
    draw: torch.Tensor,
    masked: torch.Tensor,
    weight: torch.Tensor,
    mask_token_id: int,
    num_draws: int,
    *,
    mask_uncounted: bool = False,
    prompt_masked: torch.Tensor | None = None,
    info: dict[str, torch.Tensor] | None = None,
    two_stream: bool = False,
) -> MaskedRows:
    """Rows for samples ``sample`` (``[R]``) with completion tokens ``masked`` (``[R, G]``) replaced by
    the mask id (plus every uncounted valid completion token when ``mask_uncounted``, plus prompt tokens
    ``prompt_masked`` ``[R, P]`` if given), weights ``weight`` (``[R, G]``).

    ``two_stream`` (block models): the rows run in the two-stream layout; the clean stream is the sample
    with only ``prompt_masked`` applied, the noisy copy is the masked row."""
    ids = batch.input_ids()[sample]
    valid = batch.valid()[sample]
    p = batch.prompt_len
    if two_stream and prompt_masked is not None:
        clean = ids.clone()
        clean[:, :p] = torch.where(prompt_masked.bool() & valid[:, :p], mask_token_id, ids[:, :p])
    else:
        clean = ids
    comp_masked = masked.bool()
    if mask_uncounted:
        comp_valid = valid[:, p:]
        comp_masked = comp_masked | (comp_valid & ~batch.completion_mask[sample])
    full_mask = torch.cat(
        [prompt_masked.bool() if prompt_masked is not None else torch.zeros_like(ids[:, :p], dtype=torch.bool),
         comp_masked],
        dim=1,
    ) & valid
    ids = torch.where(full_mask, torch.full_like(ids, mask_token_id), ids)
    return MaskedRows(
        input_ids=ids, valid=valid, draw=draw.long(), sample=sample.long(), weight=weight.float(),
        targets=batch.completion_ids, num_draws=num_draws, batch_size=batch.batch_size, prompt_len=p,
        clean_ids=clean if two_stream else None,
        prompt_lengths=batch.prompt_mask.sum(-1)[sample] if two_stream else None,
        info=dict(info or {}),
    )


def draw_rows(
    model: DiffusionLM,
    batch: ScoringBatch,
    parts: list[tuple[torch.Tensor, torch.Tensor]],
    num_draws: int,
    *,
    first_draws: list[int] | None = None,
    mask_uncounted: bool = False,
    prompt_masked: torch.Tensor | None = None,
    info: dict[str, torch.Tensor] | None = None,
) -> MaskedRows:
    """Rows from per-draw masks: each part is ``(masked, weight)``, both ``[B, D_k, G]``, laid out draw-major
    (row ``d * B + b``) with draw ids ``first_draws[k] + d`` (default 0); parts are concatenated in order and
    rows that mask nothing are dropped. ``prompt_masked`` (``[B, D, P]``) goes with a single part. Block models
    get two-stream rows (see the module docstring)."""
    if prompt_masked is not None and len(parts) != 1:
        raise ValueError("prompt_masked needs exactly one part")
    first_draws = first_draws or [0] * len(parts)
    if len(first_draws) != len(parts):
        raise ValueError(f"first_draws has {len(first_draws)} entries for {len(parts)} parts")
    masks, weights, draws, samples = [], [], [], []
    for (masked, weight), first in zip(parts, first_draws):
        b_n, d_n, g_n = masked.shape
        dev = masked.device
        masks.append(masked.transpose(0, 1).reshape(d_n * b_n, g_n))
        weights.append((masked * weight).transpose(0, 1).reshape(d_n * b_n, g_n).float())
        draws.append(first + torch.arange(d_n, device=dev).repeat_interleave(b_n))
        samples.append(torch.arange(b_n, device=dev).repeat(d_n))
    masked, weight = torch.cat(masks), torch.cat(weights)
    keep = masked.any(-1)
    pm = None if prompt_masked is None else prompt_masked.transpose(0, 1).reshape(masked.shape[0], -1)[keep]
    return build_rows(
        batch, torch.cat(samples)[keep], torch.cat(draws)[keep], masked[keep], weight[keep], model.mask_token_id,
        num_draws, mask_uncounted=mask_uncounted, prompt_masked=pm, info=info, two_stream=model.is_block_causal,
    )


def completion_segments(model: DiffusionLM, batch: ScoringBatch) -> tuple[torch.Tensor, int]:
    """``([B, G] long, S)``: the independent noise segment of each completion token and how many there can be.

    Full-attention models: one segment (all zeros, ``S = 1``). Block models: the token's block (the library's
    block rule on real-token positions), counted from the block holding the sample's first completion token;
    ``S`` covers a completion that starts at any offset inside a block. In the two-stream layout the blocks
    are scored independently of each other's masks, so per-block noise levels are the block model's ELBO."""
    b_n, g_n = batch.completion_ids.shape
    dev = batch.completion_ids.device
    if not model.is_block_causal:
        return torch.zeros(b_n, g_n, dtype=torch.long, device=dev), 1
    bs = int(model.block_size)
    blk = block_index(position_ids_from_valid(batch.valid()), bs)[:, batch.prompt_len :]
    first = torch.div(batch.prompt_mask.sum(-1), bs, rounding_mode="floor")
    seg = (blk - first[:, None]).clamp(min=0)
    return seg.to(dev), (bs + g_n - 2) // bs + 1


# --------------------------------------------------------------------------------------------------
# Registry


Estimator = Callable[..., TokenScores]
Planner = Callable[..., MaskedRows]

ESTIMATORS: dict[str, Estimator] = {}
PLANNERS: dict[str, Planner] = {}


def register(name: str, planner: Planner) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn`` as estimator ``name`` with the planner it runs."""

    def deco(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"estimator {name!r} registered twice")
        ESTIMATORS[name] = fn
        PLANNERS[name] = planner
        return fn

    return deco


def estimator_options(name: str) -> list[str]:
    """The keyword options estimator ``name`` accepts."""
    fn = _lookup(name)
    return [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def _lookup(name: str) -> Estimator:
    fn = ESTIMATORS.get(name)
    if fn is None:
        raise ValueError(f"unknown estimator {name!r}; valid estimators: {', '.join(sorted(ESTIMATORS))}")
    return fn


def _check_options(name: str, options: dict[str, Any]) -> None:
    valid = estimator_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"estimator {name!r} got unknown option(s) {', '.join(unknown)}; valid options: {', '.join(valid)}"
        )


def estimate(
    name: str, model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, **options: Any
) -> TokenScores:
    """Run estimator ``name`` (see :data:`ESTIMATORS`); unknown names / options raise ``ValueError``."""
    fn = _lookup(name)
    _check_options(name, options)
    return fn(model, batch, generator, **options)


def estimator_forwards(
    name: str,
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator | None = None,
    **options: Any,
) -> int:
    """How many sequences (rows) estimator ``name`` would forward for ``batch``, without running the model.

    Random estimators skip some rows depending on the draws (e.g. ``elbo`` when ``n = L``); pass the
    generator you will use for the exact number (default: a generator seeded 0).
    """
    _lookup(name)
    _check_options(name, options)
    options.pop("max_rows", None)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    rows = PLANNERS[name](model, batch, generator, **options)
    return int(rows.weight.ne(0).any(-1).sum().item())


# --------------------------------------------------------------------------------------------------
# Small validators used by the planners


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_unit_interval(name: str, value: Any, *, open_low: bool = False, open_high: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not (0.0 <= v <= 1.0) or math.isnan(v) or (open_low and v == 0.0) or (open_high and v == 1.0):
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise ValueError(f"{name} must be in {lo}0, 1{hi}, got {value!r}")
    return v
