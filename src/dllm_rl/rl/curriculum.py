"""Curricula for RL runs (the ``curriculum:`` section): stages that change the data, the generation length, the
block size, the sampling temperature and the advantage rule, and online difficulty filtering.

A run starts in stage 0, the config as given. Stage ``k`` (``curriculum.stages[k-1]``) begins once its condition
holds, checked after each step in order: ``after_step`` (that many steps done), or ``reward_above`` (the mean of
the last ``curriculum.window`` steps' rewards within the current stage above it, a full window needed). Its
changes lay over the previous stage's: another data file (``train_file``) and / or a row ``filter`` (``COLUMN OP
VALUE``, e.g. ``difficulty >= 3``, kept rows only), ``gen_length``, ``block_size`` (TraceRL's block-size
adaptation still trains at ``train.block_size``) and ``temperature`` of the rollouts, and the ``advantage`` rule
with its ``advantage_options`` (a stage naming a rule starts from that rule's own options: e.g. Pass@k training,
``pass_at_k`` with ``{k: 4}``, then ``leave_one_out``). TraDo's long-CoT model comes from such a schedule (growing
lengths and harder data; TraceRL, arXiv 2509.06949). The held-out evaluation decodes with the current stage's window
too.

Online difficulty filtering (``pass_rate_band: [lo, hi]``, after DAPO's dynamic sampling, arXiv 2503.14476, and
the seed's dynamic data): each prompt's pass rate (the share of its group with reward >= 1, the accuracy metric's
rule) is recorded when it is rolled out; a prompt whose last pass rate lies outside the band is skipped when drawn
(a prompt never rolled out is kept). The stage, its rolling rewards and the pass rates go into checkpoints, so a
run resumed across a stage boundary continues exactly.

The section's declaration (:class:`CurriculumConfig`, :class:`CurriculumStage`) is :mod:`dllm_rl.rl.curriculum_config`,
which the RL config reads; this module runs it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from dllm_rl.config import ConfigError
from dllm_rl.rl.algorithms import check_combination
from dllm_rl.rl.curriculum_config import OPS, CurriculumConfig, parse_filter
from dllm_rl.rl.run_checks import check_settings

logger = logging.getLogger(__name__)

ROLLOUT_KEYS = ("gen_length", "block_size", "temperature")  # what a stage changes in ``rollout:``
ADVANTAGE_KEYS = ("advantage", "advantage_options")  # ... and at the top level


def stage_config(cfg: Any, stage: int) -> Any:
    """The RL config of stage ``stage``: ``cfg`` with the changes of stages 1..``stage`` laid over it (a stage
    that names an advantage rule brings its own options, None: the rule's defaults)."""
    rollout, top = cfg.rollout, {k: getattr(cfg, k) for k in ADVANTAGE_KEYS}
    for s in cfg.curriculum.stages[:stage]:
        rollout = dataclasses.replace(rollout, **{k: getattr(s, k) for k in ROLLOUT_KEYS if getattr(s, k) is not None})
        if s.advantage is not None:
            top = {"advantage": s.advantage, "advantage_options": s.advantage_options}
        elif s.advantage_options is not None:
            top["advantage_options"] = s.advantage_options
    return dataclasses.replace(cfg, rollout=rollout, **top)


def stage_data(cfg: Any, stage: int) -> tuple[str | None, list[str]]:
    """``(train_file, filters)`` of stage ``stage``: the last file given up to it (None: ``data.train_file``), and
    the filters given since that file."""
    file, filters = cfg.data.train_file, []
    for s in cfg.curriculum.stages[:stage]:
        if s.train_file is not None:
            file, filters = s.train_file, []
        if s.filter is not None:
            filters.append(s.filter)
    return file, filters


def keep_row(row: dict, filters: list[str], where: str, key: str) -> bool:
    """Whether ``row`` passes every filter; a row without the column is a :class:`ConfigError` naming ``key`` and
    the row's ``where`` (file:line)."""
    for text in filters:
        column, op, value = parse_filter(text)
        if column not in row:
            raise ConfigError(f"{key}: {where} has no column {column!r} (columns: {', '.join(sorted(row))})")
        try:
            if not OPS[op](row[column], value):
                return False
        except TypeError:
            raise ConfigError(f"{key}: {where}: cannot compare {column}={row[column]!r} with {value!r}") from None
    return True


class Curriculum:
    """Which stage a run is in, the rewards that decide the next switch, and the prompts' pass rates."""

    def __init__(self, cfg: CurriculumConfig):
        self.cfg = cfg
        self.stage = 0
        self.rewards: list[float] = []  # the current stage's steps' mean rewards (the last `window`)
        self.pass_rates: dict[int, float] = {}  # prompt index in the current stage's data -> last pass rate

    def due(self, step: int, reward: float) -> bool:
        """Record step ``step``'s mean reward; whether the next stage begins now."""
        self.rewards = (self.rewards + [reward])[-self.cfg.window:]
        if self.stage >= len(self.cfg.stages):
            return False
        nxt = self.cfg.stages[self.stage]
        if nxt.after_step is not None:
            return step >= nxt.after_step
        return len(self.rewards) == self.cfg.window and math.fsum(self.rewards) / self.cfg.window > nxt.reward_above

    def why(self, step: int) -> str:
        """The reason of the switch to the next stage, in words."""
        nxt = self.cfg.stages[self.stage]
        if nxt.after_step is not None:
            return f"after_step {nxt.after_step}"
        mean = math.fsum(self.rewards) / len(self.rewards)
        return f"mean reward {mean:.4g} of the last {len(self.rewards)} steps > reward_above {nxt.reward_above:g}"

    def enter(self, stage: int, data_changed: bool) -> None:
        self.stage, self.rewards = stage, []
        if data_changed:  # the indices now name other prompts
            self.pass_rates = {}

    # ---------------------------------------------------------------- online difficulty filtering
    def keeps(self, index: int) -> bool:
        """Whether a drawn prompt is rolled out (its last pass rate within the band, or never rolled out)."""
        band = self.cfg.pass_rate_band
        rate = self.pass_rates.get(index)
        return band is None or rate is None or band[0] <= rate <= band[1]

    def record(self, indices: list[int], rewards: list[float], group: int) -> None:
        """The pass rates of the prompts ``indices`` from their groups' rewards (``group`` samples each, in
        order)."""
        for k, i in enumerate(indices):
            self.pass_rates[i] = sum(r >= 1.0 for r in rewards[k * group:(k + 1) * group]) / group

    def state_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "rewards": list(self.rewards),
                "pass_rates": {str(k): v for k, v in sorted(self.pass_rates.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage, self.rewards = int(state["stage"]), [float(r) for r in state["rewards"]]
        self.pass_rates = {int(k): float(v) for k, v in state["pass_rates"].items()}


# ------------------------------------------------------------------------------------------------ the trainer's side
def stage_task(trainer: Any, stage: int) -> tuple[Any, str]:
    """The training task of stage ``stage`` (its file, its rows filtered; refused when none is left) and where its
    rows come from."""
    from dllm_rl.eval.heldout import check_not_empty
    from dllm_rl.tasks import get_task
    from dllm_rl.tasks.io import read_rows

    cfg = trainer.base_cfg
    file, filters = stage_data(cfg, stage)
    options = {"split": "train", "prompt_style": cfg.data.prompt_style, "limit": cfg.data.train_limit,
               "reward_fn": cfg.reward.function}
    key = f"curriculum.stages[{stage - 1}]"
    if filters:
        source = file or get_task(cfg.data.task, split="train").source
        rows = [row for where, row in read_rows(source) if keep_row(row, filters, where, f"{key}.filter")]
        if not rows:
            raise ConfigError(f"{key}.filter: no row of {source} passes {' and '.join(filters)}; loosen the filter")
        task = get_task(cfg.data.task, data=rows, **options)
    else:
        task = get_task(cfg.data.task, data=file, **options)
        source = task.source
    check_not_empty(task, "training", f"{key}.train_file")
    return task, source


def check_stages(trainer: Any) -> None:
    """Every stage's config checked before the first rollout as the config as given is (its decoding settings,
    block sizes, estimator options and advantage rule against the model, and its longest prompts against the
    context: :func:`~dllm_rl.rl.run_checks.check_settings`), on its own data; a :class:`ConfigError` naming the
    stage. A stage that cannot begin within ``train.max_steps``, or whose ``reward_above`` lies outside the task
    verifier's range, is warned about or refused (:func:`check_schedule`)."""

    base = trainer.base_cfg
    check_schedule(base, trainer.train_task)
    tasks = {_data_key(base, 0): (trainer.train_task, trainer.train_task.source)}  # each stage's data, read once
    for k in range(1, len(base.curriculum.stages) + 1):
        cfg = stage_config(base, k)
        key = _data_key(base, k)
        if key not in tasks:
            task, source = stage_task(trainer, k)
            tasks[key] = task, source + (f" where {' and '.join(key[1])}" if key[1] else "")
        task, source = tasks[key]
        try:
            check_combination(cfg)
            check_settings(cfg, trainer.model, trainer.prompt_lengths, task, trainer.eval_task, source)
        except ConfigError as exc:
            raise ConfigError(f"curriculum.stages[{k - 1}]: {exc}") from None


def _data_key(cfg: Any, stage: int) -> tuple:
    file, filters = stage_data(cfg, stage)
    return file, tuple(filters)


def check_schedule(cfg: Any, task: Any) -> None:
    """Refuse a ``reward_above`` that the mean reward can never pass (at or above the top of the task verifier's
    range, ``Task.reward_range``); warn about one below its bottom (the stage begins as soon as its window is full)
    and about a stage whose ``after_step`` is not before ``train.max_steps`` (it never begins). A reward of the
    run's own (``reward.function``, terms, a model or a judge) has no known range."""
    span = None if cfg.reward.combined or task.custom_reward is not None else task.reward_range
    for k, s in enumerate(cfg.curriculum.stages):
        key = f"curriculum.stages[{k}]"
        if s.after_step is not None and s.after_step >= cfg.train.max_steps:
            logger.warning("%s never begins: its after_step %d is not before train.max_steps=%d", key, s.after_step,
                           cfg.train.max_steps)
        if s.reward_above is None or span is None:
            continue
        lo, hi = span
        if s.reward_above >= hi:
            raise ConfigError(f"{key}.reward_above: {s.reward_above:g} is never passed: the {task.name} task's "
                              f"rewards lie in [{lo:g}, {hi:g}] and the stage begins once their mean over "
                              f"curriculum.window steps is above it; give a value below {hi:g}")
        if s.reward_above < lo:
            logger.warning("%s.reward_above: %g is below the %s task's rewards [%g, %g]: the stage begins as soon as "
                           "curriculum.window steps are done", key, s.reward_above, task.name, lo, hi)


def enter_stage(trainer: Any, stage: int) -> list[str]:
    """Put ``trainer`` in stage ``stage``: its config (rollouts, updates, evaluation), its data and prompt stream
    when they change; returns the changes in words."""
    from dllm_rl.rl.block_size import run_block_sizes
    from dllm_rl.training import IndexStream

    base, old = trainer.base_cfg, trainer.cfg
    new = stage_config(base, stage)
    changes = [f"rollout.{n} {getattr(old.rollout, n)} -> {getattr(new.rollout, n)}"
               for n in ROLLOUT_KEYS if getattr(old.rollout, n) != getattr(new.rollout, n)]
    changes += [f"{n} {getattr(old, n)} -> {getattr(new, n)}" for n in ADVANTAGE_KEYS
                if getattr(old, n) != getattr(new, n)]
    trainer.cfg = trainer.collector.cfg = trainer.updater.cfg = new
    _, trainer.train_block, _ = run_block_sizes(new, trainer.model.block_size)
    trainer.updater.train_block = trainer.train_block
    data_changed = stage_data(base, stage) != stage_data(base, trainer.curriculum.stage)
    if data_changed:
        task, source = stage_task(trainer, stage)
        trainer.train_task = trainer.collector.train_task = task
        trainer.stream = trainer.collector.stream = IndexStream(len(task), seed=base.run.seed + stage)
        if trainer.reward is None:
            trainer.collector.reward_fn = task.reward_fn
        changes.append(f"data: {len(task)} prompts of {source}" + (
            f" where {' and '.join(stage_data(base, stage)[1])}" if stage_data(base, stage)[1] else ""))
    trainer.curriculum.enter(stage, data_changed)
    return changes


def advance(trainer: Any, reward: float) -> str | None:
    """After a step: record its mean reward and, when the next stage is due, enter it; returns the line that says
    so (None: no switch)."""
    cur = trainer.curriculum
    if not cur.due(trainer.step_idx, reward):
        return None
    why = cur.why(trainer.step_idx)
    stage = cur.stage + 1
    changes = enter_stage(trainer, stage)
    return f"curriculum: stage {stage} from step {trainer.step_idx + 1} ({why}): {'; '.join(changes) or 'no change'}"
