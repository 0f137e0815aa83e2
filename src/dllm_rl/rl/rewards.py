"""Reward computation that never crashes a run: a failing reward scores 0 and says why."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)


def safe_rewards(
    reward_fn: Callable[..., Sequence[Any]],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> tuple[list[float], list[str]]:
    """Call a TRL-signature reward ``(prompts, completions, **columns)`` on the whole batch; if it raises,
    score sample by sample so that only the failing samples get 0 (with the exception as the reason)."""
    try:
        values = list(reward_fn(prompts, completions, **columns))
        if len(values) != len(completions):
            raise ValueError(f"reward returned {len(values)} values for {len(completions)} completions")
        return [_as_float(v) for v in values], [getattr(v, "reason", "") for v in values]
    except Exception as exc:  # noqa: BLE001 - fall back to per-sample scoring
        logger.warning("reward failed on the batch (%s: %s); scoring samples one by one", type(exc).__name__, exc)
    rewards, reasons = [], []
    for i, completion in enumerate(completions):
        cols = {k: [v[i]] for k, v in columns.items()}
        try:
            (value,) = list(reward_fn([prompts[i]], [completion], **cols))
            rewards.append(_as_float(value))
            reasons.append(getattr(value, "reason", ""))
        except Exception as exc:  # noqa: BLE001
            rewards.append(0.0)
            reasons.append(f"reward raised {type(exc).__name__}: {str(exc)[:200]}")
            logger.warning("reward raised for sample %d: %s: %s (scored 0)", i, type(exc).__name__, exc)
    return rewards, reasons


def _as_float(value: Any) -> float:
    v = 0.0 if value is None else float(value)
    return v if v == v and abs(v) != float("inf") else 0.0
