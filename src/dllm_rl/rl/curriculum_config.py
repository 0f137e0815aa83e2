"""The ``curriculum:`` section of the RL config: its stages (:class:`CurriculumStage`) and online difficulty
filtering (:class:`CurriculumConfig`), and the row filters a stage may give (:func:`parse_filter`). What the stages do
during a run, and when they begin, is :mod:`dllm_rl.rl.curriculum`."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

import yaml

from dllm_rl.config import Checked, FieldError, field
from dllm_rl.rl.methods import ADVANTAGES

OPS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
FILTER = re.compile(r"^\s*(\w+)\s*(==|!=|<=|>=|<|>)\s*(.+?)\s*$")


def parse_filter(text: str) -> tuple[str, str, Any]:
    """``(column, op, value)`` of a row filter ``COLUMN OP VALUE``, the value read as YAML (``3``, ``hard``,
    ``'a b'``, ``true``); :class:`ValueError` saying what to write when it is not one."""
    match = FILTER.match(text)
    if match is None:
        raise ValueError(f"write COLUMN OP VALUE with OP one of == != <= >= < > (e.g. 'difficulty >= 3'), got {text!r}")
    column, op, raw = match.groups()
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:  # e.g. 'target >=', read as target > '=' (a YAML tag, not a value)
        raise ValueError(f"got {text!r}, whose value {raw!r} (after {op!r}) is not a number, a word or a quoted "
                         "string; write COLUMN OP VALUE, e.g. 'difficulty >= 3'") from None
    return column, op, value


def _filter_problem(text: str) -> str | None:
    try:
        parse_filter(text)
    except ValueError as exc:
        return str(exc)
    return None


def _band_problem(band: list[float]) -> str | None:
    if len(band) != 2 or not 0.0 <= band[0] <= band[1] <= 1.0:
        return f"give two numbers [lo, hi] with 0 <= lo <= hi <= 1, got {band}"
    return None


@dataclass
class CurriculumStage(Checked):
    """One entry of ``curriculum.stages``: when it begins, and what it changes (unset: as in the stage before)."""

    after_step: int | None = field(None, ge=1, help="begin once this many steps are done")
    reward_above: float | None = field(
        None, help="begin once the mean reward of the last curriculum.window steps of the stage before is above it")
    train_file: str | None = field(None, help="training data file from this stage on (the same task)")
    filter: str | None = field(None, check=_filter_problem,
                               help="keep only the rows whose COLUMN OP VALUE holds (e.g. 'difficulty >= 3'; OP: "
                                    "== != <= >= < >), applied to this stage's data")
    gen_length: int | None = field(None, ge=1, help="rollout.gen_length from this stage on")
    block_size: int | None = field(None, ge=1, help="rollout.block_size from this stage on (block models)")
    temperature: float | None = field(None, ge=0, help="rollout.temperature from this stage on")
    advantage: str | None = field(None, choices=ADVANTAGES,
                                  help="advantage rule from this stage on (its options: this stage's "
                                       "advantage_options, else the rule's defaults)")
    advantage_options: dict | None = field(
        None, help="advantage_options from this stage on (e.g. {k: 1} for pass_at_k)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.after_step is None) == (self.reward_above is None):
            raise FieldError("after_step", "give exactly one of after_step, reward_above (when the stage begins)")


@dataclass
class CurriculumConfig(Checked):
    """The ``curriculum:`` section: stages after the config as given, and online difficulty filtering."""

    stages: list[CurriculumStage] = field(
        default_factory=list, help="stages after the config as given (stage 0), in order; each entry: after_step "
        "or reward_above (when it begins), and any of train_file, filter ('COLUMN OP VALUE'), gen_length, "
        "block_size, temperature, advantage, advantage_options (what it changes). The switch is printed and "
        "logged (curriculum_stage)")
    window: int = field(10, ge=1, help="steps whose mean reward a stage's reward_above compares")
    pass_rate_band: list[float] | None = field(
        None, check=_band_problem, help="online difficulty filtering: skip drawn prompts whose last pass rate "
        "(share of their group with reward >= 1) lies outside [lo, hi] (e.g. [0.1, 0.9]); pass rates kept in "
        "checkpoints")

    def __post_init__(self) -> None:
        super().__post_init__()
        # stages are entered in order, each checked once the one before has begun: a step count not after an
        # earlier one would begin its stage one step after that one (the stage before it would last one step)
        latest: tuple[int, int] | None = None  # (index, after_step) of the last stage with a step count
        for k, s in enumerate(self.stages):
            if s.after_step is None:
                continue
            if latest is not None and s.after_step <= latest[1]:
                raise FieldError(f"stages[{k}].after_step", f"{s.after_step} is not after curriculum.stages"
                                 f"[{latest[0]}].after_step ({latest[1]}); stages begin in the order given, so "
                                 "list them by increasing after_step")
            latest = (k, s.after_step)
