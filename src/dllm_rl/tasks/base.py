"""Task base class: load examples, build prompts, score completions.

A :class:`Task` holds examples (dicts with at least ``prompt``, the user-message text, plus the task's
answer columns and every raw column of the source row) and scores completions with a reward callable in
TRL's signature::

    reward(prompts, completions, **dataset_columns) -> list[Score]

:class:`Score` is a ``float`` subclass, so TRL and our trainer see plain floats, while ``.reason`` (a short
string for logs) and ``.info`` (extra flags such as sudoku's ``solved``) ride along with every value.
Rewards never raise on model output: anything unparseable scores 0 with a reason.

Data sources: local ``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.csv`` / ``.parquet`` files, an in-memory
list of dicts, or a Hugging Face dataset (``hf:owner/name[:config][@split]``; imports ``datasets`` only
then); with no data given, a named task reads its default for the split: bundled file, benchmark-data
folder, else its canonical hub dataset (:mod:`dllm_rl.tasks.io`). Bad rows raise :class:`DataError`
naming the file, line and field. :class:`Score` lives in :mod:`dllm_rl.tasks.score`.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dllm_rl.errors import UserError

from .io import DataError, data_file, default_source, find_data_dir, is_hf_name, read_rows
from .score import Score

__all__ = ["PROMPT_STYLES", "DataError", "RewardError", "Score", "Task", "completion_text", "data_file",
           "find_data_dir", "is_hf_name", "load_callable", "read_rows", "require_fields", "reward_name"]

PROMPT_STYLES = ("chat", "plain", "compact")


class RewardError(UserError):
    """A reward tried to end the run (``sys.exit`` and the like): a reward returns scores; it can neither end
    a run nor make a failed one look finished (exit status 0 without metrics or a model)."""


def reward_name(fn: Callable) -> str:
    """How messages name a reward callable: ``module:qualname`` (what ``reward=`` takes), else its repr."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else repr(fn)


def _call_custom(fn: Callable, prompts: Any, completions: Sequence[Any], columns: Mapping[str, Any]) -> Any:
    """``fn(prompts, completions, **columns)``. An exception is the caller's to handle (the RL trainer scores
    the samples one by one), and Ctrl-C stays the user's; anything else that is not an exception
    (``SystemExit`` from ``sys.exit(0)``, ``GeneratorExit``) becomes one :class:`RewardError` naming the reward,
    so that a reward cannot end the run as if it had finished."""
    try:
        return fn(prompts, completions, **columns)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit and the like, re-raised as a user error
        raise RewardError(f"reward {reward_name(fn)!r} raised {type(exc).__name__}({exc}): a reward must return one "
                          "score per completion and may not end the run; fix the reward") from None


def _custom_score(value: Any, name: str) -> Score:
    """A custom reward's value as a :class:`Score`: a number, or a sequence of per-step scores (process rewards,
    :mod:`dllm_rl.rewards.safe`) kept in ``info["steps"]`` with their sum as the value. ``None`` is not a
    score: it becomes NaN, which the RL trainer counts and scores 0 (``reward_nonfinite``)."""
    if isinstance(value, Score):
        return value
    if isinstance(value, (list, tuple)):
        steps = [math.nan if v is None else float(v) for v in value]
        return Score(sum(steps), name, steps=steps)
    return Score(math.nan, f"{name} returned None") if value is None else Score(float(value), name)


def completion_text(completion: Any) -> str:
    """The text of one completion as TRL passes it: a string, a list of chat messages (the last
    message's content), a message dict, bytes (decoded, invalid bytes replaced) or None (empty)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, bytes | bytearray):
        return bytes(completion).decode("utf-8", "replace")
    if isinstance(completion, Mapping):
        return completion_text(completion.get("content", ""))
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, Mapping) and "type" in last and "text" in last:  # content parts
            return "".join(str(p.get("text", "")) for p in completion if isinstance(p, Mapping))
        return completion_text(last)
    return str(completion) if completion else ""


def require_fields(
    row: Mapping[str, Any], where: str, fields: Iterable[str | tuple[str, ...]], task: str
) -> None:
    """Raise DataError naming ``where`` (file and line) when a required field (or every alternative
    of a tuple of fields) is missing or null."""
    for spec in fields:
        alts = (spec,) if isinstance(spec, str) else tuple(spec)
        if not any(row.get(a) is not None for a in alts):
            want = " or ".join(repr(a) for a in alts)
            have = ", ".join(sorted(map(str, row))) or "none"
            raise DataError(f"{where}: missing field {want} needed by the {task} task (row has: {have})")


def load_callable(spec: str | Callable) -> Callable:
    """A callable from ``"package.module:function"`` (or a callable, returned as is). Raises
    :class:`~dllm_rl.errors.UserError` saying which part of ``spec`` does not resolve and why."""
    if callable(spec):
        return spec
    mod, _, attr = str(spec).partition(":")
    if not mod or not attr:
        raise UserError(f"reward {spec!r}: expected 'package.module:function'")
    try:
        obj = importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (mod == exc.name or mod.startswith(exc.name + ".")):
            raise UserError(f"reward {spec!r}: no module named {exc.name!r} (is its folder on PYTHONPATH?)") from None
        raise UserError(f"reward {spec!r}: importing {mod!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises at import is reported, not hidden
        raise UserError(f"reward {spec!r}: importing {mod!r} raised {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"reward {spec!r}: {getattr(obj, '__name__', mod)!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"reward {spec!r}: {attr!r} is a {type(obj).__name__}, not a function")
    return obj


# ------------------------------------------------------------------------------------------------ Task
class Task:
    """A dataset plus its prompt format and reward.

    Args:
        data: a file (``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.csv`` / ``.parquet``), ``hf:owner/name``,
            a list of row dicts, or None for the task's default data (:meth:`default_data`).
        split: which default file (``"train"`` / ``"test"``) and the split of a HF dataset.
        limit: keep only the first ``limit`` examples.
        prompt_style: ``"chat"`` (instruction text; :meth:`build_prompt` applies the tokenizer's chat
            template), ``"plain"`` (the same text, never templated) or ``"compact"`` (a terse one-line
            format for character-level tiny models; countdown / sudoku / arith only).
        system_prompt: optional system message for the chat template.
        reward_fn: a TRL-style reward ``(prompts, completions, **columns) -> list[float]`` (or
            ``"module:function"``) that replaces the built-in reward.
    """

    name: ClassVar[str] = "task"
    #: fields each raw row must have (a tuple = any one of the alternatives)
    required_fields: ClassVar[tuple[str | tuple[str, ...], ...]] = ()
    #: split -> path of the default file, relative to the bundled data / the benchmark-data folder
    default_files: ClassVar[dict[str, str]] = {}
    #: split -> the canonical hub dataset, ``hf:owner/name[:config]@split`` (read when no file is found)
    hub_datasets: ClassVar[dict[str, str]] = {}
    prompt_styles: ClassVar[tuple[str, ...]] = ("chat", "plain")
    #: whether the task scores completions itself (False: a reward model, judge or function must)
    has_verifier: ClassVar[bool] = True
    #: the range of the built-in verifier's rewards (every built-in task: 0 wrong, 1 right, a fraction between for
    #: partial credit); a curriculum stage's reward_above is checked against it
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(
        self,
        data: str | os.PathLike | Sequence[Mapping[str, Any]] | None = None,
        *,
        split: str = "test",
        limit: int | None = None,
        prompt_style: str = "chat",
        system_prompt: str | None = None,
        reward_fn: str | Callable | None = None,
    ) -> None:
        if prompt_style not in self.prompt_styles:
            raise UserError(
                f"task {self.name!r} has no prompt_style {prompt_style!r}; "
                f"choose one of {', '.join(self.prompt_styles)}"
            )
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.data = data
        self.split = split
        self.limit = limit
        self.prompt_style = prompt_style
        self.system_prompt = system_prompt
        self.custom_reward = load_callable(reward_fn) if reward_fn is not None else None
        self._examples: list[dict[str, Any]] | None = None

    # --------------------------------------------------------------------------------------- data
    def default_data(self, split: str | None = None) -> Path | str:
        """The default data of ``split``: a bundled file, the file in the benchmark-data folder, else the task's
        hub dataset (``hf:...``; :func:`~dllm_rl.tasks.io.default_source`). FileNotFoundError when it has none."""
        split = split or self.split
        known = {**self.hub_datasets, **self.default_files}
        if split not in known:
            if not known:
                raise FileNotFoundError(f"task {self.name!r} has no default data; pass data=<file>")
            raise FileNotFoundError(
                f"task {self.name!r} has no default {split!r} data (has: {', '.join(known)}); pass data=<file>")
        return default_source(self.default_files.get(split), self.hub_datasets.get(split),
                              f"task {self.name!r}, split {split!r}")

    @property
    def source(self) -> str:
        """Where the examples come from (for logs)."""
        if self.data is None:
            try:
                return str(self.default_data())
            except FileNotFoundError:
                return "<none>"
        return str(self.data) if isinstance(self.data, str | os.PathLike) else "<in-memory rows>"

    def raw_rows(self) -> Iterator[tuple[str, dict]]:
        """``(location, raw row)`` pairs from the data source, before :meth:`prepare`."""
        if self.data is None:
            yield from read_rows(self.default_data(), split=self.split)
        elif isinstance(self.data, str | os.PathLike):
            yield from read_rows(self.data, split=self.split)
        else:
            for i, row in enumerate(self.data):
                if not isinstance(row, Mapping):
                    raise DataError(f"rows[{i}]: expected a dict, got {type(row).__name__}")
                yield f"rows[{i}]", dict(row)

    def load(self) -> list[dict[str, Any]]:
        """Read, validate and prepare all examples (cached)."""
        if self._examples is None:
            out = []
            for where, row in self.raw_rows():
                if self.limit is not None and len(out) >= self.limit:
                    break
                ex = self.prepare(row, where)
                if ex is not None:
                    out.append(ex)
            self._examples = out
        return self._examples

    @property
    def examples(self) -> list[dict[str, Any]]:
        """The prepared examples (loads them on first use)."""
        return self.load()

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.examples[i]

    def prepare(self, row: dict[str, Any], where: str = "<row>") -> dict[str, Any] | None:
        """Validate a raw row, add the task's answer columns and the ``prompt`` (user-message text).
        Returns None to skip the row (e.g. a split filter). Raw columns are kept."""
        require_fields(row, where, self.required_fields, self.name)
        ex = self.normalize(dict(row), where)
        if ex is None:
            return None
        ex["prompt"] = self.format_prompt(ex)
        return ex

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any] | None:
        """Task-specific: parse raw fields into answer columns (raise DataError on bad values)."""
        return row

    # ------------------------------------------------------------------------------------- prompts
    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """The user-message text of an example in this task's ``prompt_style``."""
        raise NotImplementedError

    def messages(self, example: Mapping[str, Any]) -> list[dict[str, str]]:
        """Chat messages for the example: optional system message, then the user message."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": str(example["prompt"])}]

    def build_prompt(self, example: Mapping[str, Any], tokenizer: Any = None) -> str:
        """The text the model is conditioned on.

        ``chat`` style with a tokenizer that has a chat template: the template applied to
        :meth:`messages` with the generation prompt. Otherwise (``plain``, ``compact``, or no
        template): the user text itself, preceded by the system prompt and a blank line if one is set.
        """
        text = str(example["prompt"])
        if (
            self.prompt_style == "chat"
            and tokenizer is not None
            and getattr(tokenizer, "chat_template", None)
        ):
            return tokenizer.apply_chat_template(
                self.messages(example), tokenize=False, add_generation_prompt=True
            )
        if self.system_prompt and self.prompt_style != "compact":
            return f"{self.system_prompt}\n\n{text}"
        return text

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """A completion that scores 1.0 for this example (for SFT warm-up and tests), if one is known."""
        return None

    # -------------------------------------------------------------------------------------- rewards
    def extract_answer(self, text: str) -> str | None:
        """The answer string the reward reads from a completion (None when there is none)."""
        return None

    def score_one(self, completion: Any, example: Mapping[str, Any]) -> Score:
        """Score one completion against one example; never raises (errors score 0 with a reason)."""
        try:
            return self._score(completion_text(completion), example)
        except Exception as exc:  # a reward must never crash training on odd model output
            return Score(0.0, f"reward error: {type(exc).__name__}: {str(exc)[:200]}")

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        raise NotImplementedError

    def score(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[Score]:
        """TRL-signature reward: one :class:`Score` per completion.

        ``columns`` are the dataset columns as lists aligned with ``completions`` (TRL passes every
        column except ``prompt``; extra keyword arguments such as ``trainer_state`` are ignored).
        """
        n = len(completions)
        if self.custom_reward is not None:
            values = _call_custom(self.custom_reward, prompts, completions, columns)
            name = getattr(self.custom_reward, "__name__", "custom")
            return [_custom_score(v, name) for v in values]
        examples = self.rows_from_columns(prompts, n, columns)
        return self._score_batch([completion_text(c) for c in completions], examples)

    __call__ = score

    def _score_batch(self, texts: list[str], examples: list[dict[str, Any]]) -> list[Score]:
        return [self.score_one(t, ex) for t, ex in zip(texts, examples)]

    @staticmethod
    def rows_from_columns(prompts: Sequence[Any] | None, n: int, columns: Mapping[str, Any]) -> list[dict]:
        """Turn TRL's column lists back into one dict per completion."""
        cols = {k: v for k, v in columns.items() if isinstance(v, list | tuple) and len(v) == n}
        rows = [{k: v[i] for k, v in cols.items()} for i in range(n)]
        if prompts is not None and len(prompts) == n:
            for r, p in zip(rows, prompts):
                r.setdefault("prompt", p)
        return rows

    def score_examples(
        self, completions: Sequence[Any], examples: Sequence[Mapping[str, Any]]
    ) -> list[Score]:
        """Score completions against example dicts (as returned by :attr:`examples`), one each."""
        if len(completions) != len(examples):
            raise ValueError(
                f"{len(completions)} completions for {len(examples)} examples; pass one example "
                "per completion (repeat examples for several samples per prompt)"
            )
        cols = {k: [ex.get(k) for ex in examples] for k in set().union(*examples)} if examples else {}
        cols.pop("prompt", None)
        return self.score([ex.get("prompt") for ex in examples], list(completions), **cols)

    @property
    def reward_fn(self) -> Callable[..., list[Score]]:
        """This task's reward as a plain function (named ``<task>_reward``, as TRL logs it)."""

        def reward(prompts: Sequence[Any] | None, completions: Sequence[Any], **columns: Any) -> list[Score]:
            return self.score(prompts, completions, **columns)

        reward.__name__ = reward.__qualname__ = f"{self.name}_reward"
        return reward

    @property
    def reward_name(self) -> str:
        """The reward's name in messages: the custom reward's ``module:function``, else ``<task>_reward``."""
        return reward_name(self.custom_reward) if self.custom_reward is not None else f"{self.name}_reward"

    def metrics(self, scores: Sequence[Score]) -> dict[str, float]:
        """Aggregate scores: mean ``reward`` and ``accuracy`` (fraction with reward 1.0)."""
        n = max(len(scores), 1)
        return {"reward": sum(map(float, scores)) / n, "accuracy": sum(float(s) >= 1.0 for s in scores) / n}

    def close(self) -> None:
        """Release worker processes (math verifier pool); safe to call more than once."""

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(source={self.source!r}, split={self.split!r}, style={self.prompt_style!r})"
