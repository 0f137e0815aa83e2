"""The ``reward:`` section of a run (:class:`RewardConfig`): how completions are scored, by a task's verifier, a custom
function, a reward model, an LLM judge or a weighted list of terms, and the guards around the call. Read by the RL
trainer (:mod:`dllm_rl.rl.config`) and usable by any command that scores completions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dllm_rl.config import FieldError, field
from dllm_rl.errors import UserError
from dllm_rl.rewards.judge_config import JudgeConfig
from dllm_rl.rewards.reward_model import RewardModelConfig
from dllm_rl.rewards.reward_terms import RewardTerm


def _reward_problem(spec: str) -> str | None:
    """What is wrong with a ``module:function`` reward (it is imported now, at config time), or None."""
    from dllm_rl.tasks.base import load_callable

    try:
        load_callable(spec)
    except UserError as exc:
        return str(exc).removeprefix("reward ")
    return None


@dataclass
class RewardConfig(RewardModelConfig):
    """How completions are scored (the ``reward:`` section): the task's verifier unless a function, a reward model
    (``model`` and the settings it runs with), an LLM judge (``judge:``) or a weighted list of ``terms`` replaces
    it, and the guards around the call.

    The terms live here, as ``reward.terms``, rather than in a top-level ``rewards:`` list: everything that scores
    a completion is one section, and no two top-level keys differ by one letter."""

    function: str | None = field(
        None, check=_reward_problem,
        help="custom reward 'module:function' with TRL's signature (prompts, completions, **columns) -> "
        "list[float]; replaces the task's built-in reward (imported when the config is read). It also receives "
        "the rollout's completion_ids and step_map columns (per completion: its answer's token ids, and the "
        "decoding step of each, -1 for prefilled tokens)")
    timeout_s: float | None = field(
        None, gt=0, help="seconds one call of the reward may take (all of a round's completions at once, or one "
        "completion when a failed batch is scored one by one); past it the call's samples score 0 and count as "
        "failed. Interrupts Python code through SIGALRM (POSIX, the main thread); a C call is interrupted when it "
        "returns. null = no limit")
    max_failure_steps: int = field(
        3, ge=0, help="stop after this many steps in a row in which the reward raised (or timed out) on every "
        "sample, naming its last error (a failing sample scores 0 and counts in the reward_errors metric; NaN, "
        "inf and None rewards score 0 and count in reward_nonfinite). 0 = never stop")
    judge: JudgeConfig = field(
        default_factory=JudgeConfig, help="an LLM judge (outcome or process rewards): its model, prompt template, "
        "parsing and batching; judge.model alone (no reward.terms) makes it the reward")
    terms: list[RewardTerm] = field(
        default_factory=list, help="a weighted sum of rewards, each entry one of {task: NAME or module:function}, "
        "{model: ORG/NAME or DIR} (run with this section's reward-model settings) or {judge: ORG/NAME or DIR} (run "
        "with reward.judge's settings), with weight (default 1) and name (its reward_NAME metric). Empty: the "
        "task's reward, or reward.model / reward.judge.model alone; {speed: tpf | per_pass | per_token} rewards "
        "decoding speed where the answer is right (docs/rewards.md). The held-out evaluation keeps the task's "
        "reward (its accuracy)")
    normalization: Literal["sum", "decoupled"] = field(
        "sum", help="how the terms make advantages: sum (the advantage rule on their weighted sum) | decoupled "
        "(LightningRL's, arXiv 2603.13319 Eq. 5-7: the advantage rule on each term alone, weighted and summed, "
        "then normalised over the batch; needs reward.terms)")

    def __post_init__(self) -> None:
        super().__post_init__()
        combined = [k for k, v in (("terms", self.terms), ("model", self.model), ("judge.model", self.judge.model))
                    if v]
        if self.function and combined:
            raise FieldError("function", f"is not combined with reward.{combined[0]}; list it as a term instead "
                             f"(reward.terms: [{{task: {self.function}}}, ...])")
        if self.normalization == "decoupled" and not self.terms:
            raise FieldError("normalization", "decoupled normalises each of reward.terms on its own; list the "
                             "terms (e.g. [{task: countdown}, {speed: tpf, weight: 0.5}])")

    @property
    def combined(self) -> bool:
        """Whether the reward is built from terms, a reward model or a judge (:mod:`dllm_rl.rewards.reward_terms`)."""
        return bool(self.terms or self.model or self.judge.model)
