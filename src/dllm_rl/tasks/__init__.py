"""Tasks: datasets, prompt formats, rewards / verifiers and synthetic generators (code runs in :mod:`dllm_rl.sandbox`).

Entry point: :func:`get_task` -> :class:`~dllm_rl.tasks.base.Task`::

    task = get_task("gsm8k", split="test", limit=100)
    prompts = [task.build_prompt(ex, tokenizer) for ex in task.examples]
    scores = task.reward_fn(prompts, completions, **columns)   # TRL signature; list[Score] (floats)
    scores[0].reason                                           # why, for logs

Built-in names: ``gsm8k``, ``math``, ``countdown``, ``sudoku``, ``arith``, ``code`` (HumanEval by
default), ``humaneval``, ``mbpp``, ``chat`` (conversations without a verifier: UltraFeedback, HH-RLHF, ...),
and the image tasks ``shapes``, ``image_choice`` and ``image_math`` (rows carry
images: :mod:`dllm_rl.tasks.image_task`; ``task.images(example)`` gives them as PIL images). A local file or
``hf:owner/name`` needs ``task_type=<name>``; its reward may be replaced by any TRL-style callable
(``reward=...``).

Submodules are imported lazily so that ``import dllm_rl.tasks`` stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError

from .base import DataError, Score, Task, completion_text, find_data_dir, is_hf_name

__all__ = [
    "DataError",
    "Score",
    "Task",
    "completion_text",
    "find_data_dir",
    "get_task",
    "list_tasks",
    "register_task",
    "task_factory",
    "unregister_task",
]

_REGISTRY: dict[str, str | Callable[..., Task]] = {
    "gsm8k": "dllm_rl.tasks.gsm8k:GSM8KTask",
    "math": "dllm_rl.tasks.math_task:MathTask",
    "countdown": "dllm_rl.tasks.countdown:CountdownTask",
    "sudoku": "dllm_rl.tasks.sudoku:SudokuTask",
    "arith": "dllm_rl.tasks.arith:ArithTask",
    "chat": "dllm_rl.tasks.chat:ChatTask",
    "code": "dllm_rl.tasks.code:CodeTask",
    "humaneval": "dllm_rl.tasks.code:code_task_for:humaneval",
    "mbpp": "dllm_rl.tasks.code:code_task_for:mbpp",
    "shapes": "dllm_rl.tasks.shapes:ShapesTask",
    "image_choice": "dllm_rl.tasks.image_choice:ImageChoiceTask",
    "image_math": "dllm_rl.tasks.image_math:ImageMathTask",
}


def register_task(name: str, factory: str | Callable[..., Task]) -> None:
    """Add a task to the registry: a Task subclass / factory, or ``"module:Class"``."""
    _REGISTRY[name] = factory


def task_factory(name: str) -> Callable[..., Task] | None:
    """What builds task ``name`` (its class or factory, imported now), or None when no task has that name."""
    return _factory(name) if name in _REGISTRY else None


def unregister_task(name: str) -> None:
    """Remove ``name`` from the registry (nothing when it is not there)."""
    _REGISTRY.pop(name, None)


def list_tasks() -> list[str]:
    """Names :func:`get_task` accepts."""
    return sorted(_REGISTRY)


def _factory(name: str) -> Callable[..., Task]:
    spec = _REGISTRY[name]
    if callable(spec):
        return spec
    mod, attr, *arg = spec.split(":")
    obj = getattr(importlib.import_module(mod), attr)
    return obj(*arg) if arg else obj


def get_task(name_or_path: str | Path | Task, **options: Any) -> Task:
    """Build a task by name, or from a data file / HF dataset with ``task_type``.

    Options go to the task class (``data``, ``split``, ``limit``, ``prompt_style``, ``system_prompt``,
    ``reward_fn`` and task-specific ones such as ``strict``, ``timeout_s``, ``dataset``). Aliases:
    ``reward`` = ``reward_fn`` (a task name selects that task's reward, like ``task_type``); ``path``
    = ``data``.
    """
    if isinstance(name_or_path, Task):
        return name_or_path
    opts = dict(options)
    if "path" in opts:
        opts.setdefault("data", opts.pop("path"))
    task_type = opts.pop("task_type", None)
    reward = opts.pop("reward", None)
    if isinstance(reward, str) and reward in _REGISTRY:
        task_type = task_type or reward
        reward = None
    if reward is not None:
        opts["reward_fn"] = reward
    name = str(name_or_path)
    if name in _REGISTRY and not Path(name).exists():
        if task_type not in (None, name):
            raise UserError(f"task {name!r} given with task_type={task_type!r}; pass a data file instead")
        return _factory(name)(**opts)
    path_like = Path(name).expanduser().exists() or is_hf_name(name) or Path(name).suffix != ""
    if not path_like:
        raise UserError(
            f"unknown task {name!r}; choose one of {', '.join(list_tasks())} or pass a data file "
            "(.jsonl/.csv/.parquet) with task_type=..."
        )
    if not Path(name).expanduser().exists() and not is_hf_name(name):
        raise FileNotFoundError(f"data file {name} does not exist")
    if task_type is None:
        raise UserError(
            f"cannot tell which task {name!r} is: pass task_type=<{'|'.join(list_tasks())}> "
            "(CLI: --task-type)"
        )
    if task_type not in _REGISTRY:
        raise UserError(f"unknown task_type {task_type!r}; choose one of {', '.join(list_tasks())}")
    opts["data"] = name
    if task_type in ("code",) and "dataset" not in opts:
        opts["dataset"] = None
    return _factory(task_type)(**opts)
