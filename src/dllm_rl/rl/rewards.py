"""Reward computation that never crashes a run: a failing reward scores 0 and says why.

A reward callable returns one value per completion: a number (the outcome reward) or, for **process rewards**,
a sequence of numbers, one per decoding step of that completion's rollout in decoding order (score ``k`` for the
``k``-th distinct step at which its answer tokens were committed: the order of the distinct values of its
``step_map`` over ``completion_mask``; a shorter list leaves the remaining steps at 0). The value model
(:mod:`dllm_rl.rl.value`) puts each score on its step; every other consumer (group advantages, filters,
metrics) uses the sum of the scores. A task wraps a custom reward's per-step list in a
:class:`dllm_rl.tasks.Score` whose value is the sum and whose ``info["steps"]`` is the list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Scores = tuple[list[float], list[str], list[list[float] | None]]


def safe_scores(
    reward_fn: Callable[..., Sequence[Any]],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> Scores:
    """``(totals, reasons, step_scores)``: call a TRL-signature reward ``(prompts, completions, **columns)`` on the
    whole batch; if it raises, score sample by sample so that only the failing samples get 0 (with the exception
    as the reason). ``step_scores[i]`` is sample ``i``'s per-step scores (``None`` for an outcome reward) and
    ``totals[i]`` their sum (or the outcome reward); non-finite numbers count as 0."""
    try:
        values = list(reward_fn(prompts, completions, **columns))
        if len(values) != len(completions):
            raise ValueError(f"reward returned {len(values)} values for {len(completions)} completions")
        parsed = [_as_score(v) for v in values]
        return [p[0] for p in parsed], [getattr(v, "reason", "") for v in values], [p[1] for p in parsed]
    except Exception as exc:  # noqa: BLE001 - fall back to per-sample scoring
        logger.warning("reward failed on the batch (%s: %s); scoring samples one by one", type(exc).__name__, exc)
    totals, reasons, steps = [], [], []
    for i, completion in enumerate(completions):
        cols = {k: [v[i]] for k, v in columns.items()}
        try:
            (value,) = list(reward_fn([prompts[i]], [completion], **cols))
            total, per_step = _as_score(value)
            totals.append(total)
            steps.append(per_step)
            reasons.append(getattr(value, "reason", ""))
        except Exception as exc:  # noqa: BLE001
            totals.append(0.0)
            steps.append(None)
            reasons.append(f"reward raised {type(exc).__name__}: {str(exc)[:200]}")
            logger.warning("reward raised for sample %d: %s: %s (scored 0)", i, type(exc).__name__, exc)
    return totals, reasons, steps


def safe_rewards(
    reward_fn: Callable[..., Sequence[Any]],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> tuple[list[float], list[str]]:
    """``(rewards, reasons)`` of :func:`safe_scores` (per-step scores summed)."""
    totals, reasons, _ = safe_scores(reward_fn, prompts, completions, columns)
    return totals, reasons


def _as_score(value: Any) -> tuple[float, list[float] | None]:
    steps = (getattr(value, "info", None) or {}).get("steps")  # a task's Score carrying process rewards
    if steps is not None:
        steps = [_as_float(v) for v in steps]
        return float(sum(steps)), steps
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1):
        steps = [_as_float(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
        return float(sum(steps)), steps
    return _as_float(value), None


def _as_float(value: Any) -> float:
    v = 0.0 if value is None else float(value)
    return v if v == v and abs(v) != float("inf") else 0.0
