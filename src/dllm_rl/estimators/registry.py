"""The estimator registry (verl ``core_algos`` style): an estimator is one *row planner* registered by name.

Uniform-state families (DiffusionGemma, ``Family.noise == "uniform"``) have no mask token and no rows to plan:
their estimators are *scorers* ``score(model, batch, generator, *, option=...) -> TokenScores`` registered with
``@register_uniform("name", counterpart=..., check=...)``. :data:`NOISE` records the noise kind each estimator
scores, and :func:`check_noise` — called by :func:`estimate`, :func:`plan_rows` and :func:`estimator_forwards` — is
the one place that refuses an estimator of the other kind, naming the ones that fit. :data:`COUNTERPART` maps a
masked estimator onto the uniform-state scorer that plays its part (``trace`` -> ``trajectory``, ``elbo`` ->
``uniform_elbo``): the one table an RL preset is carried over to a uniform family by (:func:`counterpart`).

A planner ``plan(model, batch, generator, *, option=...) -> MaskedRows`` draws every random number it needs
from the caller's generator and returns the masked rows to forward with each completion token's weight
(:mod:`dllm_rl.estimators.rows`). Scoring is shared: :func:`estimate` plans the rows with the registered
planner (:func:`plan_rows`, which also resolves the rows' layout block) and scores them with
:func:`dllm_rl.estimators.scoring.score_rows`. A new estimator is one planner
function plus ``@register("name")``.

:func:`estimator_forwards` runs only the planner, so a cost benchmark can count forwards without running the
model; :func:`estimator_options` lists the options a name accepts (its planner's keyword-only parameters and
the scorer's memory bounds ``max_rows`` and ``logprob_chunk_size``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from dllm_rl.errors import UserError
from dllm_rl.estimators.batch import MaskedRows, ScoringBatch, TokenScores
from dllm_rl.estimators.scoring import score_rows
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.registry import registrar

Planner = Callable[..., MaskedRows]

# Options of the shared scorer (:func:`dllm_rl.estimators.scoring.score_rows`), accepted by every estimator.
SCORER_OPTIONS = ("max_rows", "logprob_chunk_size")

ESTIMATORS: dict[str, Planner] = {}
#: the noise kind (``Family.noise``) each estimator scores: "mask" for the row planners, "uniform" for the scorers
NOISE: dict[str, str] = {}
#: masked estimator -> the uniform-state scorer that plays its part on a uniform family (declared by the scorer)
COUNTERPART: dict[str, str] = {}
#: uniform-state scorer -> its options' check (raises ValueError), run before any model forward
_CHECKS: dict[str, Callable[..., None]] = {}
_SCORES = {"mask": "masked diffusion", "uniform": "uniform-state diffusion"}
_IS = {"mask": "masked", "uniform": "uniform-state"}

_register = registrar(ESTIMATORS, "estimator")


def register(name: str) -> Callable[[Planner], Planner]:
    """``@register("name")``: register ``planner`` as estimator ``name`` (a masked-diffusion row planner)."""
    NOISE.setdefault(name, "mask")
    return _register(name)


def register_uniform(name: str, *, counterpart: str | None = None, check: Callable[..., None] | None = None
                     ) -> Callable[[Callable[..., TokenScores]], Callable[..., TokenScores]]:
    """``@register_uniform("name")``: register a uniform-state scorer (returns :class:`TokenScores` itself).
    ``counterpart``: the masked estimator whose part it plays (:data:`COUNTERPART`); ``check(**options)``: its
    options' checks (``ValueError``), which :func:`check_options` runs without the model."""
    NOISE.setdefault(name, "uniform")
    if counterpart is not None:
        COUNTERPART[counterpart] = name
    if check is not None:
        _CHECKS[name] = check
    return _register(name)


def counterpart(name: str, noise: str) -> str | None:
    """The estimator that plays ``name``'s part on a family of noise kind ``noise``: ``name`` itself when it scores
    that kind, its declared counterpart (:data:`COUNTERPART`), or None when it has none."""
    if NOISE.get(name, "mask") == noise:
        return name
    return COUNTERPART.get(name) if noise == "uniform" else next((m for m, u in COUNTERPART.items() if u == name), None)


def check_options(name: str, options: dict[str, Any]) -> None:
    """``ValueError`` for an option estimator ``name`` does not take (by name) or, for a uniform-state scorer, a bad
    value of one (its declared ``check``), without the model (masked planners check theirs while planning)."""
    _check_options(name, options)
    if name in _CHECKS:
        _CHECKS[name](**options)


def check_noise(family, name: str) -> None:
    """Refuse estimator ``name`` on a model of ``family`` whose noise kind it does not score (:class:`UserError`,
    one line naming the estimators that fit)."""
    kind, noise = NOISE.get(name, "mask"), getattr(family, "noise", "mask")
    if kind != noise:
        fits = " or ".join(repr(n) for n in sorted(n for n, k in NOISE.items() if k == noise)) or "none yet"
        raise UserError(f"estimator {name!r} scores {_SCORES[kind]}; {family.name} is {_IS[noise]}: use {fits}")


def _lookup(name: str) -> Planner:
    planner = ESTIMATORS.get(name)
    if planner is None:
        raise ValueError(f"unknown estimator {name!r}; valid estimators: {', '.join(sorted(ESTIMATORS))}")
    return planner


def estimator_options(name: str) -> list[str]:
    """The keyword options estimator ``name`` accepts: its planner's keyword-only parameters, then the scorer's
    (:data:`SCORER_OPTIONS`)."""
    params = inspect.signature(_lookup(name)).parameters.values()
    own = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return own if NOISE.get(name) == "uniform" else own + [o for o in SCORER_OPTIONS if o not in own]


def _check_options(name: str, options: dict[str, Any]) -> None:
    valid = estimator_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"estimator {name!r} got unknown option(s) {', '.join(unknown)}; valid options: {', '.join(valid)}"
        )


def estimate(
    model: DiffusionLM, name: str, batch: ScoringBatch, generator: torch.Generator | None, *,
    agree_calls: Callable[[int], int] | None = None, entropy: bool = False, **options: Any
) -> TokenScores:
    """Per-token log-probs and weights of estimator ``name`` (see :data:`ESTIMATORS`) for ``batch``.

    Plans the rows with the registered planner (all randomness from ``generator``) and scores them,
    ``max_rows`` rows per model call, the LM head projecting ``logprob_chunk_size`` scored positions at a time
    (default :data:`dllm_rl.models.logprobs.DEFAULT_CHUNK_SIZE`; 0 = off). Unknown names or options raise
    ``ValueError`` naming the valid ones. ``agree_calls``: see :func:`~dllm_rl.estimators.scoring.score_rows`
    (sharded training only). ``entropy``: the scores hold each scored token's predictive entropy instead of its
    log-prob (:func:`~dllm_rl.estimators.scoring.score_rows`).
    """
    _check_options(name, options)
    check_noise(model.family, name)
    if NOISE[name] == "uniform":
        if batch.images is not None:
            raise ValueError(f"ScoringBatch.images: estimator {name!r} takes no image features")
        return ESTIMATORS[name](model, batch, generator, **options)
    scorer = {k: options.pop(k) for k in SCORER_OPTIONS if k in options}
    return score_rows(model, plan_rows(model, name, batch, generator, **options), agree_calls=agree_calls,
                      entropy=entropy, **scorer)


def plan_rows(model: DiffusionLM, name: str, batch: ScoringBatch, generator: torch.Generator | None,
         **options: Any) -> MaskedRows:
    """The rows estimator ``name``'s planner draws for ``batch`` (planner options only), laid out at the batch's
    block (``batch.block_size``; the model's own when unset): ``rows.block_size`` is that block, resolved. Tokens
    outside ``batch.loss_mask`` get weight 0: drawn and masked as planned, never scored."""
    if batch.images is not None and model.is_block_causal:
        raise ValueError(f"ScoringBatch.images: image features are spliced into full-attention models' prompts "
                         f"(llada_v); a {model.family.name} model takes none")
    planner = _lookup(name)
    check_noise(model.family, name)
    if NOISE[name] != "mask":
        raise ValueError(f"estimator {name!r} scores canvas by canvas and plans no rows")
    rows = planner(model, batch, generator, **options)
    rows.block_size = model.layout_block(batch.block_size)
    if batch.loss_mask is not None:  # the tokens that do not train keep their place in the rows, unscored
        rows.weight = rows.weight * batch.loss_mask[rows.sample.to(batch.loss_mask.device)].to(rows.weight)
    return rows


def estimator_forwards(
    model: DiffusionLM,
    name: str,
    batch: ScoringBatch,
    generator: torch.Generator | None = None,
    **options: Any,
) -> int:
    """How many sequences (rows) estimator ``name`` would forward for ``batch``, without running the model.

    Random estimators skip some rows depending on the draws (e.g. ``elbo`` when ``n = L``); pass the
    generator you will use for the exact number (default: a generator seeded 0).
    """
    _check_options(name, options)
    for k in SCORER_OPTIONS:
        options.pop(k, None)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    rows = plan_rows(model, name, batch, generator, **options)
    return int(rows.weight.ne(0).any(-1).sum().item())
