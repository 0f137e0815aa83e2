"""A weighted sum of reward terms: verifiable task rewards, reward models, LLM judges and speed
(``reward.terms: [{task: gsm8k, weight: 1.0}, {model: ORG/NAME, weight: 0.5}, {judge: ORG/NAME, weight: 0.2},
{speed: tpf, weight: 0.5}]``).

The sum is one TRL-signature reward, so the trainer calls it as any other. A reward model term runs with the
``reward:`` section's settings (:class:`~dllm_rl.rewards.reward_model.RewardModelConfig`) and a judge term with the
``reward.judge:`` section's (:class:`~dllm_rl.rewards.judge.JudgeConfig`); the term names only the model. Each term's
raw value (before its weight) is kept per sample for logging (:attr:`CombinedReward.last_terms`,
:meth:`CombinedReward.metrics`) and in each :class:`~dllm_rl.tasks.Score`'s ``info["terms"]``, which the decoupled
normalisation reads (:func:`dllm_rl.rl.advantages.decoupled_advantages`).

A speed term (:mod:`dllm_rl.rewards.speed`) counts only where the answer is right: where every task term scores 1 or
more (the accuracy the trainer reports); elsewhere its value is 0.

When a term gives process rewards (per decoding step: a judge in process mode, or a task reward's per-step list),
the sum is per step too: per-step terms add step by step (times their weights) and every outcome term's weighted
value goes on the completion's last decoding step, where the value model puts an outcome reward; the total is
the plain weighted sum either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_rl.config import Checked, FieldError, field
from dllm_rl.errors import UserError
from dllm_rl.rewards.judge import Judge, JudgeConfig
from dllm_rl.rewards.reward_model import RewardModel, RewardModelConfig
from dllm_rl.rewards.speed import SPEEDS, SpeedReward, gate
from dllm_rl.tasks import Score, get_task, list_tasks
from dllm_rl.tasks.base import load_callable

KINDS = ("task", "model", "judge", "speed")


@dataclass
class RewardTerm(Checked):
    """One entry of ``reward.terms``: exactly one of ``task``, ``model``, ``judge``, ``speed``, and its weight."""

    task: str | None = field(None, help="a verifiable reward: a task name (e.g. gsm8k; its reward reads the data's "
                                        "columns) or package.module:function")
    model: str | None = field(None, help="a sequence-classification reward model (ORG/NAME or a folder), run with "
                                         "the reward: section's settings")
    judge: str | None = field(None, help="an LLM judge (ORG/NAME or a folder of a causal LM), run with the judge: "
                                         "section's settings")
    speed: str | None = field(None, choices=SPEEDS,
                              help="decoding speed, counted only where the task terms say the answer is right: tpf "
                                   "(answer tokens per forward pass, LightningRL arXiv 2603.13319) | per_pass (1 / "
                                   "passes) | per_token (1 - passes / answer tokens, at least 0); needs a task term "
                                   "and a dynamic rollout schedule (rollout.threshold) for the passes to vary")
    weight: float = field(1.0, help="the term's weight in the sum of rewards")
    name: str | None = field(None, help="the term's name in logs (reward_NAME); default: the task's name, "
                                        "reward_model, judge or speed_KIND")

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [k for k in KINDS if getattr(self, k)]
        if len(given) != 1:
            raise FieldError(given[1] if given else "task", "give exactly one of task, model, judge, speed per "
                             f"reward.terms entry (this one has {', '.join(given) or 'none'})")
        if self.speed and self.weight < 0:
            raise FieldError("weight", f"a speed term's weight is 0 or more (got {self.weight:g}): a negative one "
                             "would reward wrong answers, whose speed counts 0, above slow right ones")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k))

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        task = getattr(self.task, "__name__", None) or str(self.task).rpartition(":")[2]  # a function or its name
        return {"task": task, "model": "reward_model", "judge": "judge", "speed": f"speed_{self.speed}"}[self.kind]


@dataclass
class Term:
    """A built term: its name in logs, its weight and its reward callable."""

    name: str
    weight: float
    fn: Callable[..., Sequence[Any]]
    kind: str = "task"  # task | model | judge | speed: a speed term is gated on the task terms


def _value(v: Any) -> tuple[float, list[float] | None]:
    """(total, per-step scores or None) of one value a term gave."""
    steps = (getattr(v, "info", None) or {}).get("steps")
    if steps is None and isinstance(v, (list, tuple)):
        steps = v
    if steps is not None:
        steps = [math.nan if s is None else float(s) for s in steps]
        return math.fsum(steps), steps
    return (math.nan if v is None else float(v)), None


def _num_steps(step_map: Sequence[int] | None) -> int:
    return len({s for s in step_map if s >= 0}) if step_map is not None else 0


class CombinedReward:
    """The weighted sum of :class:`Term` s as one TRL-signature reward returning a
    :class:`~dllm_rl.tasks.Score` per completion (per-step scores in ``info["steps"]`` where a term gives them)."""

    def __init__(self, terms: Sequence[Term], key: str = "reward.terms"):
        names = [t.name for t in terms]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise UserError(f"{key}: two terms are named {dup!r}; give each a distinct name")
        if not terms:
            raise UserError(f"{key}: no reward term; give at least one of task, model, judge")
        self.terms = list(terms)
        self.last_terms: dict[str, list[float]] = {}
        self._sums: dict[str, list[float]] = {}  # per term: [sum, count] of raw values since the last metrics()
        self.__name__ = "+".join(names)  # how messages name the reward

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[Score]:
        n = len(completions)
        per_term = []
        for t in self.terms:
            values = list(t.fn(prompts, completions, **columns))
            if len(values) != n:
                raise ValueError(f"reward term {t.name!r} returned {len(values)} values for {n} completions")
            per_term.append([_value(v) for v in values])
        right = self.right(per_term)
        for k, t in enumerate(self.terms):
            if getattr(t.fn, "gated", False):  # a speed term: 0 where the answer is not right
                per_term[k] = [(v, None) for v in gate([v for v, _ in per_term[k]], right)]
            self.last_terms[t.name] = [total for total, _ in per_term[k]]
            acc = self._sums.setdefault(t.name, [0.0, 0])
            acc[0] += math.fsum(self.last_terms[t.name])
            acc[1] += n
        step_maps = columns.get("step_map")
        return [self._combine([vals[i] for vals in per_term], step_maps[i] if step_maps is not None else None)
                for i in range(n)]

    def right(self, per_term: list[list[tuple[float, Any]]]) -> list[bool]:
        """Per sample: whether every task term scored 1 or more (the answer is right)."""
        tasks = [vals for t, vals in zip(self.terms, per_term) if t.kind == "task"]
        n = len(per_term[0]) if per_term else 0
        return [bool(tasks) and all(vals[i][0] >= 1.0 - 1e-9 for vals in tasks) for i in range(n)]

    def _combine(self, values: list[tuple[float, list[float] | None]], step_map: Sequence[int] | None) -> Score:
        total = math.fsum(t.weight * v for t, (v, _) in zip(self.terms, values))
        reason = "; ".join(f"{t.name}={v:.4g}" for t, (v, _) in zip(self.terms, values))
        terms = {t.name: v for t, (v, _) in zip(self.terms, values)}
        if all(steps is None for _, steps in values):
            return Score(total, reason, terms=terms)
        width = max([_num_steps(step_map)] + [len(s) for _, s in values if s is not None] + [1])
        out = [0.0] * width
        for t, (v, steps) in zip(self.terms, values):
            if steps is None:
                out[-1] += t.weight * v
            else:
                for k, s in enumerate(steps):
                    out[k] += t.weight * s
        return Score(total, reason, steps=out, terms=terms)

    def metrics(self) -> dict[str, float]:
        """The mean raw value of each term (``reward_NAME``) over the calls since the previous ``metrics()`` (an RL
        step's rounds and its rollout hook's calls: the trainer takes them once per step), and the judges'
        counters over the run."""
        out = {f"reward_{name}": total / count for name, (total, count) in self._sums.items() if count}
        self._sums = {}
        for t in self.terms:
            out.update(getattr(t.fn, "stats", {}))
        return out

    def state_dict(self) -> dict[str, Any]:
        """Each stateful term's state (a reward model's normalisation), by name, for an exact resume."""
        return {t.name: t.fn.state_dict() for t in self.terms if hasattr(t.fn, "state_dict")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t in self.terms:
            if t.name in state:
                t.fn.load_state_dict(state[t.name])


def _task_reward(spec: str | Callable, key: str, task: Any) -> Callable[..., Sequence[Any]]:
    if callable(spec) or ":" in spec:  # a function, given in Python or as package.module:function
        return load_callable(spec)
    if spec not in list_tasks():
        raise UserError(f"{key}: unknown task {spec!r}; give one of {', '.join(list_tasks())} or "
                        "package.module:function")
    scorer = task if task is not None and spec == getattr(task, "name", None) else get_task(spec)
    if not scorer.has_verifier:
        raise UserError(f"{key}: the {spec} task has no verifier; name a reward model, a judge or a function")
    return scorer.reward_fn


def build_reward(terms: Sequence[RewardTerm], reward_model: RewardModelConfig | None = None,
                 judge: JudgeConfig | None = None, task: Any = None, policy_tokenizer: Any = None,
                 key: str = "reward") -> CombinedReward:
    """The reward of a ``reward.terms`` list: each term built (models loaded, templates checked) before any
    rollout, so a bad term ends the run at once with a message naming its key (under the section ``key``).
    ``task`` (the run's training task) serves a term naming it; ``policy_tokenizer`` cuts completions into chunks
    for a judge in process mode. An empty ``terms`` with ``reward_model.model`` or ``judge.model`` set means that
    one model (both: the two), weight 1."""
    keyed = [(t, f"{key}.terms[{i}].{t.kind}") for i, t in enumerate(terms)]
    if any(t.kind == "speed" for t in terms) and not any(t.kind == "task" for t in terms):
        raise UserError(f"{key}.terms: a speed term counts only where the answer is right, which a task term says; "
                        "add one (e.g. {task: countdown})")
    if not terms:
        if reward_model is not None and reward_model.model:
            keyed.append((RewardTerm(model=reward_model.model), f"{key}.model"))
        if judge is not None and judge.model:
            keyed.append((RewardTerm(judge=judge.model), f"{key}.judge.model"))
    built = []
    for term, term_key in keyed:
        if term.kind == "task":
            fn = _task_reward(term.task, term_key, task)
        elif term.kind == "speed":
            fn = SpeedReward(term.speed, key=term_key)
        elif term.kind == "model":
            fn = RewardModel(dataclasses.replace(reward_model or RewardModelConfig(), model=term.model), key=term_key)
        else:
            fn = Judge(dataclasses.replace(judge or JudgeConfig(), model=term.judge), key=f"{key}.judge",
                       policy_tokenizer=policy_tokenizer, model_key=term_key)
        built.append(Term(term.label, term.weight, fn, term.kind))
    return CombinedReward(built, key=f"{key}.terms")
