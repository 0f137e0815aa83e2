"""Rollout hooks: code that sees each round of rollouts after its rewards and may replace some of them.

The trainer calls the configured hook (``rollout_hook`` / ``rollout_hook_options`` in the RL config) once
per round, right after the rewards, with a :class:`RoundView` (the round's prompts, rollouts, rewards and
dataset columns) and a :class:`HookContext` (how to decode and reward more rollouts). The hook returns the
view to train on - the same one, or one with some rollouts replaced (:func:`replace_samples`). Advantages,
group filtering and the update then run on what it returns.

A hook is registered by name with a factory that takes its options and returns the hook function, or a
:class:`RolloutHook` holding it with the facts the trainer reads (typed fields; a bare function has none)::

    @register_hook("my_hook")
    def my_hook(*, some_option: int = 1) -> RolloutHook:
        def hook(view: RoundView, ctx: HookContext) -> RoundView:
            ...
        return RolloutHook(hook)

IGPO's inpainting (:mod:`dllm_rl.rl.methods.igpo`) is one. A hook with ``replaces_round=True`` decodes the round
itself (d-TreeRPO's tree rollouts, :mod:`dllm_rl.rl.methods.d_treerpo`): the trainer then decodes and rewards
nothing before calling it (``view.rollout`` is None, ``view.rewards`` empty), and the hook returns the round's
samples, rewards and ``advantages``; its ``samples_per_prompt(num_generations)`` says how many samples it returns
per prompt (:func:`samples_per_prompt`).

A hook may also say what the update trains on instead of the round's samples (``RoundView.training``, a
:class:`TrainingRows`: rows built from the samples, with their own advantages): MDPO (:mod:`dllm_rl.rl.methods.mdpo`)
trains on (state before a decoding step, that step's prediction) pairs. The samples' rewards stay what the round
reports (metrics, logs); the training rows all train (the group filter and the advantage rule judge samples, not
them). A hook with ``records_steps`` (``"sampled"`` or ``"greedy"``) gets rollouts that record every step's
prediction (``generate(record_steps=...)``); one with ``makes_training_rows=True`` cannot run with the value model or
``dynamic_sampling`` (both work on the samples). A hook may set ``advantages`` itself: one per sample, or one per
completion token (``[n, L]``: EGSPO's stepwise advantages). A hook with a ``check`` is given the resolved RL config
before the run (``check(cfg)`` raises ``ValueError`` naming the key that does not fit it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from dllm_rl.registry import registrar
from dllm_rl.sampling import Rollout


@dataclass
class TrainingRows:
    """What the update trains on instead of a round's samples: ``rollout`` (one row per training row), their
    ``advantages`` (``[M]`` float32) and ``source[m]``, the round's sample row ``m`` comes from (its mask seed)."""

    rollout: Rollout
    advantages: torch.Tensor
    source: list[int]

    def __post_init__(self) -> None:
        if not len(self.rollout) == len(self.advantages) == len(self.source):
            raise ValueError(f"TrainingRows: {len(self.rollout)} rows, {len(self.advantages)} advantages and "
                             f"{len(self.source)} sources")


@dataclass
class RoundView:
    """One round: ``group_size`` consecutive samples per prompt. ``prompt_ids``/``prompts`` (token ids and
    text), ``rewards``/``reasons``, ``seeds`` (rollout noise) and every ``columns`` value are per sample;
    ``stats`` collects the hook's numbers for the step's metrics (summed over rounds); ``advantages`` (per sample,
    or a ``[n, L]`` tensor per completion token) are set by a hook that computes them itself (tree rollouts,
    EGSPO's stepwise returns), else the trainer computes them from the rewards."""

    prompt_ids: list[list[int]]
    prompts: list[str]
    rollout: Rollout | None
    rewards: list[float]
    reasons: list[str]
    seeds: list[int]
    columns: dict[str, list]
    group_size: int
    stats: dict[str, float] = field(default_factory=dict)
    training: TrainingRows | None = None  # set by a hook that trains on rows of its own (see the module docstring)
    advantages: list[float] | torch.Tensor | None = None


@dataclass
class HookContext:
    """What a hook may call: ``generate(indices, prefill)`` decodes new rollouts for samples ``indices`` (their
    prompts, fresh seeds) with ``prefill[k]`` (completion offset -> token id) committed before decoding;
    ``reward(indices, rollout)`` rewards them as the round was (``(rewards, reasons)``); ``reference(i)`` is
    the task's reference completion text of sample ``i`` (or None); ``tokenizer``, ``eos_token_id`` (the id to
    append), ``eos_token_ids`` (every id that ends an answer; empty: that one) and ``gen_length`` describe the
    completions; ``step`` is the RL step. ``generate(..., until_block=[...])`` stops
    sample ``indices[k]`` after ``until_block[k]`` decoded blocks (a partial state); ``span(i)`` is sample ``i``'s
    ``(decoded blocks, completion slots)``; ``mask_token_id`` marks the slots a partial state has not decoded;
    ``advantage``/``scale_rewards``/``advantage_options`` are the run's advantage rule, scaling and options."""

    generate: Callable[..., Rollout]
    reward: Callable[[list[int], Rollout], tuple[list[float], list[str]]]
    reference: Callable[[int], str | None]
    tokenizer: Any
    eos_token_id: int
    gen_length: int
    step: int
    span: Callable[[int], tuple[int, int]] | None = None
    mask_token_id: int = -1
    advantage: str = "group_zscore"
    scale_rewards: str = "group"
    advantage_options: dict | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends an answer."""
        return self.eos_token_ids or (self.eos_token_id,)


HookFunction = Callable[[RoundView, HookContext], RoundView]


@dataclass(frozen=True)
class RolloutHook:
    """A built rollout hook: its function ``run`` and the facts the trainer reads (the module docstring):
    ``records_steps`` (None, ``"sampled"`` or ``"greedy"``), ``makes_training_rows``, ``replaces_round``,
    ``samples_per_prompt`` (``num_generations -> samples``, for a hook that replaces the round; None: as many as
    generated) and ``check`` (``cfg -> None``, raising ``ValueError``). Calling it calls ``run``."""

    run: HookFunction
    records_steps: Literal["sampled", "greedy"] | None = None
    makes_training_rows: bool = False
    replaces_round: bool = False
    samples_per_prompt: Callable[[int], int] | None = None
    check: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if self.records_steps not in (None, "sampled", "greedy"):
            raise ValueError(f"RolloutHook.records_steps: None, 'sampled' or 'greedy', got {self.records_steps!r}")
        if self.samples_per_prompt is not None and not self.replaces_round:
            raise ValueError("RolloutHook.samples_per_prompt: only a hook that replaces the round says how many "
                             "samples it returns")

    def __call__(self, view: RoundView, ctx: HookContext) -> RoundView:
        return self.run(view, ctx)


ROLLOUT_HOOKS: dict[str, Callable[..., RolloutHook | HookFunction]] = {}


#: ``rollout_hook: off``: no hook, also where the algorithm's preset names one (None takes the preset's).
NO_HOOK = "off"
#: ``@register_hook("name")``: register a hook factory (keyword options -> hook) as ``rollout_hook: name``.
register_hook = registrar(ROLLOUT_HOOKS, "rollout hook")


def samples_per_prompt(hook: RolloutHook | None, num_generations: int) -> int:
    """The samples a round holds per prompt: ``rollout.num_generations``, or what a hook that decodes the round
    itself returns (its ``samples_per_prompt``; a tree's non-root nodes)."""
    if hook is None or hook.samples_per_prompt is None:
        return num_generations
    return int(hook.samples_per_prompt(num_generations))


def make_hook(name: str | None, options: Mapping[str, Any] | None) -> RolloutHook | None:
    """The hook ``name`` built with ``options`` (None or :data:`NO_HOOK`: no hook). Unknown names or options raise
    ``ValueError``."""
    if name is None or name == NO_HOOK:
        if options and name == NO_HOOK:
            raise ValueError(f"rollout_hook_options: rollout_hook={NO_HOOK} runs no hook, so it takes no options")
        if options:
            raise ValueError("rollout_hook_options: set rollout_hook too (the hook they configure)")
        return None
    if name not in ROLLOUT_HOOKS:
        raise ValueError(f"rollout_hook: unknown hook {name!r}; valid: {', '.join(sorted(ROLLOUT_HOOKS))}, "
                         f"{NO_HOOK} (no hook)")
    factory = ROLLOUT_HOOKS[name]
    valid = [p.name for p in inspect.signature(factory).parameters.values() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(options or {}) - set(valid))
    if unknown:
        raise ValueError(f"rollout_hook_options: {', '.join(unknown)} not options of {name!r}; valid: "
                         f"{', '.join(valid)}")
    hook = factory(**dict(options or {}))
    return hook if isinstance(hook, RolloutHook) else RolloutHook(hook)


def replace_samples(view: RoundView, indices: list[int], rollout: Rollout, rewards: list[float],
                    reasons: list[str]) -> RoundView:
    """``view`` with samples ``indices`` replaced by the rows of ``rollout`` (in order) and their rewards."""
    if not (len(indices) == len(rollout) == len(rewards) == len(reasons)):
        raise ValueError(f"replace_samples: {len(indices)} indices for {len(rollout)} rollouts, "
                         f"{len(rewards)} rewards and {len(reasons)} reasons")
    n = len(view.rewards)
    order = list(range(n))
    new_rewards, new_reasons = list(view.rewards), list(view.reasons)
    for k, i in enumerate(indices):
        order[i] = n + k
        new_rewards[i], new_reasons[i] = float(rewards[k]), reasons[k]
    merged = Rollout.cat([view.rollout, rollout]).select(order)
    return replace(view, rollout=merged, rewards=new_rewards, reasons=new_reasons)
