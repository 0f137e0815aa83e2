"""Reward computation that never crashes a run, and that a reward cannot end or fake.

A reward callable returns one value per completion: a number (the outcome reward) or, for **process rewards**,
a sequence of numbers, one per decoding step of that completion's rollout in decoding order (score ``k`` for the
``k``-th distinct step at which its answer tokens were committed: the order of the distinct values of its
``step_map`` over ``completion_mask``; a shorter list leaves the remaining steps at 0). The value model
(:mod:`dllm_rl.rl.value`) puts each score on its step; every other consumer (group advantages, filters,
metrics) uses the sum of the scores. A task wraps a custom reward's per-step list in a
:class:`dllm_rl.tasks.Score` whose value is the sum and whose ``info["steps"]`` is the list.

What a reward can do wrong, and what happens:

- it raises: the samples are scored one by one, and only the failing ones score 0 (``failed``, the exception
  as the reason); the trainer stops after ``reward.max_failure_steps`` steps in a row failed on every sample;
- it returns NaN, inf or None: that value scores 0 and is counted (``nonfinite``; the trainer warns and logs
  ``reward_nonfinite``);
- it returns a finite value beyond ±:data:`REWARD_LIMIT`: :class:`~dllm_rl.tasks.base.RewardError` (one line);
- it takes longer than ``timeout_s`` (``reward.timeout_s``): the call's samples score 0 as failed;
- it calls ``sys.exit``: :class:`~dllm_rl.tasks.base.RewardError` naming it (raised by the task, passed on here).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dllm_rl.tasks.base import RewardError

logger = logging.getLogger(__name__)

#: the largest reward magnitude trained on: past it the group statistics in float32 overflow (squares beyond
#: 3.4e38 once rewards pass ~1e19) and the differences between samples vanish, so such a value is a bug in
#: the reward or a scale to bring down
REWARD_LIMIT = 1e15


@dataclass
class Scored:
    """One reward call's results, per sample, and what went wrong in it."""

    totals: list[float]  # the reward (the sum of the per-step scores for a process reward)
    reasons: list[str]
    steps: list[list[float] | None]  # per-step scores of a process reward, else None
    failed: int = 0  # samples whose reward raised or timed out (scored 0)
    nonfinite: int = 0  # NaN / inf / None values (scored 0)
    error: str = ""  # the last failure, "Type: message"
    terms: list[dict[str, float] | None] = field(default_factory=list)  # per sample: a combined reward's raw terms


class RewardTimeout(TimeoutError):
    """A reward call took longer than ``reward.timeout_s``."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`RewardTimeout` in the code inside once ``seconds`` have passed (``SIGALRM``: interrupts
    Python code, not a C call until it returns; POSIX main thread only, elsewhere no limit with a warning)."""
    if not seconds:
        yield
        return
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        logger.warning("reward.timeout_s=%g is not applied: it needs the main thread of a POSIX process", seconds)
        yield
        return

    def expire(signum, frame):
        raise RewardTimeout(f"took longer than reward.timeout_s={seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def safe_scores(
    reward_fn: Callable[..., Sequence[Any]],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
    *,
    name: str | None = None,
    timeout_s: float | None = None,
) -> Scored:
    """Call a TRL-signature reward ``(prompts, completions, **columns)`` on the whole batch; if it raises, score
    sample by sample so that only the failing samples get 0 (with the exception as the reason). ``name`` names
    the reward in messages; ``timeout_s`` bounds each call. See the module docstring for what counts where."""
    name = name or getattr(reward_fn, "__name__", "reward")
    try:
        with _deadline(timeout_s):
            values = list(reward_fn(prompts, completions, **columns))
        if len(values) != len(completions):
            raise ValueError(f"reward returned {len(values)} values for {len(completions)} completions")
        out = Scored([], [], [])
        for v in values:
            _add(out, v, name)
        return out
    except (RewardError, KeyboardInterrupt):
        raise
    except RewardTimeout as exc:  # no retry one by one: that would take up to len(completions) times as long
        logger.warning("reward %s %s on a batch of %d; its samples score 0", name, exc, len(completions))
        n = len(completions)
        return Scored([0.0] * n, [f"reward {exc}"] * n, [None] * n, failed=n, error=f"RewardTimeout: {exc}",
                      terms=[None] * n)
    except Exception as exc:  # noqa: BLE001 - fall back to per-sample scoring
        logger.warning("reward failed on the batch (%s: %s); scoring samples one by one", type(exc).__name__, exc)
    out = Scored([], [], [])
    for i, completion in enumerate(completions):
        cols = {k: [v[i]] for k, v in columns.items()}
        try:
            with _deadline(timeout_s):
                (value,) = list(reward_fn([prompts[i]], [completion], **cols))
            _add(out, value, name)
        except (RewardError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001
            out.totals.append(0.0)
            out.steps.append(None)
            out.terms.append(None)
            out.reasons.append(f"reward raised {type(exc).__name__}: {str(exc)[:200]}")
            out.failed += 1
            out.error = f"{type(exc).__name__}: {str(exc)[:200]}"
            logger.warning("reward raised for sample %d: %s: %s (scored 0)", i, type(exc).__name__, exc)
    return out


def safe_rewards(
    reward_fn: Callable[..., Sequence[Any]],
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list[Any]],
    **options: Any,
) -> tuple[list[float], list[str]]:
    """``(rewards, reasons)`` of :func:`safe_scores` (per-step scores summed; ``options``: its keywords)."""
    out = safe_scores(reward_fn, prompts, completions, columns, **options)
    return out.totals, out.reasons


def _add(out: Scored, value: Any, name: str) -> None:
    """Append one reward value (a number, a per-step sequence, or a task's Score carrying one) to ``out``."""
    steps = (getattr(value, "info", None) or {}).get("steps")  # a task's Score carrying process rewards
    if steps is None and (isinstance(value, (list, tuple)) or (hasattr(value, "tolist")
                                                               and getattr(value, "ndim", 0) == 1)):
        steps = value.tolist() if hasattr(value, "tolist") else value
    if steps is not None:
        steps = [_number(out, v, name) for v in steps]
        total = float(sum(steps))
    else:
        total = _number(out, value, name)
    out.totals.append(total)
    out.steps.append(steps)
    out.terms.append((getattr(value, "info", None) or {}).get("terms"))
    out.reasons.append(getattr(value, "reason", ""))


def _number(out: Scored, value: Any, name: str) -> float:
    """``value`` as a float: NaN / inf / None count in ``out.nonfinite`` and score 0; past the limit, refused."""
    v = math.nan if value is None else float(value)
    if not math.isfinite(v):
        out.nonfinite += 1
        return 0.0
    if abs(v) > REWARD_LIMIT:
        raise RewardError(f"reward {name!r} returned {v:g}: rewards must lie within ±{REWARD_LIMIT:g} (the "
                          "advantages are float32 statistics of the group); scale the reward down")
    return v
