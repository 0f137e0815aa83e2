"""Experiment trackers (``report_to``) through accelerate's tracking API.

``report_to: [tensorboard | wandb | trackio | mlflow]`` (or ``none``) opens accelerate's tracker classes the
way ``Accelerator.init_trackers`` does, logs the resolved config (flattened to ``section.key``) as
hyperparameters, and then receives every row of ``metrics.jsonl`` under the same names
(:class:`~dllm_rl.training.metrics.MetricsLogger` forwards them). Where each keeps its data:

- ``tensorboard``: ``OUTPUT_DIR/tensorboard/<run name>/`` (event files; ``tensorboard --logdir OUTPUT_DIR``);
- ``trackio``: trackio's local database (``$TRACKIO_DIR``, default ``$HF_HOME/trackio``), project ``dllm-rl``;
- ``wandb``: project ``dllm-rl`` (``WANDB_MODE=offline`` works); ``mlflow``: ``OUTPUT_DIR/mlruns``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

#: tracker name -> the package it needs
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
PROJECT = "dllm-rl"


def check_report_to(value: list[str]) -> str | None:
    """What is wrong with a ``report_to`` list (None: fine), for the config checks."""
    names = list(value)
    for name in names:
        if name != "none" and name not in TRACKERS:
            return f"unknown tracker {name!r}; choose from {', '.join([*TRACKERS, 'none'])}"
    if "none" in names and len(names) > 1:
        return "'none' cannot be combined with trackers"
    for name in names:
        if name in TRACKERS and importlib.util.find_spec(TRACKERS[name]) is None:
            return f"{name!r} needs the {TRACKERS[name]} package (pip install {TRACKERS[name]})"
    return None


def flat_config(values: Any, prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config dict flattened to ``a.b`` keys with scalar values (what trackers take as
    hyperparameters): None becomes ``"none"``, lists and other values their ``str``."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in dict(values).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = "none" if value is None else str(value)
    return out


def open_trackers(report_to: list[str], run_dir: str | Path, config: dict[str, Any] | None = None) -> list:
    """Start accelerate trackers for ``report_to`` (``none`` / empty: no tracker) with ``config`` (flattened)
    stored as hyperparameters; the run is named after ``run_dir``."""
    from accelerate import PartialState
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    names = [n for n in report_to if n != "none"]
    problem = check_report_to(names)
    if problem:
        from dllm_rl.errors import UserError

        raise UserError(f"report_to: {problem}")
    if not names:
        return []
    PartialState()  # accelerate's trackers log only on the main process, which this state tells them
    run_dir = Path(run_dir)
    run_name = run_dir.resolve().name
    trackers = []
    for name in names:
        cls = LOGGER_TYPE_TO_CLASS[name]
        if name == "tensorboard":
            tracker = cls(run_name, logging_dir=str(run_dir / "tensorboard"))
        elif name == "mlflow":
            tracker = cls(experiment_name=PROJECT, logging_dir=str(run_dir / "mlruns"), run_name=run_name)
        elif name == "wandb":
            tracker = cls(PROJECT, name=run_name, dir=str(run_dir))
        else:  # trackio
            tracker = cls(PROJECT, name=run_name)
        tracker.start()
        if config:
            tracker.store_init_configuration(flat_config(config))
        trackers.append(tracker)
    return trackers
