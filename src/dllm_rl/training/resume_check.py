"""A resumed run against the checkpoint it continues: the settings that make the run what it is (method, model,
data, seed, estimator, lengths, optimiser, ...) may not change on resume, since the resumed half would belong to
another run than the first (and the optimiser and schedule state come from the checkpoint anyway, so a changed
``optim.lr`` would be recorded but not used). Each trainer names the few settings that may change and take
effect from the resumed step (steps, checkpoint and logging cadence, memory knobs); those are applied and said.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dllm_rl.config import ConfigError, to_dict

# RL settings that may change on resume: they take effect from the resumed step and change no past step
RL_APPLICABLE = ("max_steps", "max_time_minutes", "max_bad_steps", "max_skipped_steps", "max_reward_failure_steps",
                 "reward_timeout_s", "save_every", "keep_checkpoints",
                 "log_samples_every", "save_rollouts", "progress", "push_to_hub", "report_to", "device",
                 "distributed_timeout_s", "logprob_chunk_size", "rollout.batch_size", "eval.every", "output_dir")
SFT_APPLICABLE = ("train.max_steps", "train.num_epochs", "train.stop_after", "train.log_every", "train.save_every",
                  "train.keep_checkpoints", "train.progress", "train.num_threads", "train.cpu", "train.push_to_hub",
                  "train.report_to", "train.distributed_timeout_s", "train.output_dir",
                  "objective.logprob_chunk_size", "model.gradient_checkpointing")
RL_IGNORED = ("resume", "overwrite")
SFT_IGNORED = ("train.resume", "train.overwrite")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (dicts of free-form options, e.g. ``estimator_options``, are leaves
    when empty)."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_resumed_config(checkpoint: Path, cfg: Any, applicable: tuple[str, ...], ignored: tuple[str, ...],
                         key: str = "output_dir") -> list[str]:
    """Compare ``cfg`` with the config saved in ``checkpoint`` (its ``config.yaml``).

    Raises :class:`~dllm_rl.config.ConfigError` naming every changed setting outside ``applicable`` (with
    both values); returns the applied changes as ``"key old -> new"`` (empty when none, or when the
    checkpoint has no config to compare with). Keys the checkpoint's config lacks (a newer setting) are
    taken as given and listed."""
    file = checkpoint / "config.yaml"
    if not file.is_file():
        return []
    saved = flatten(yaml.safe_load(file.read_text()) or {})
    now = flatten(yaml.safe_load(yaml.safe_dump(to_dict(cfg), sort_keys=False)) or {})
    refused, applied = [], []
    for name, value in now.items():
        if name in ignored or saved.get(name, value) == value:
            if name not in saved and name not in ignored:
                applied.append(f"{name} {value!r} (not in the checkpoint's config)")
            continue
        change = f"{name} {saved[name]!r} -> {value!r}"
        (applied if name in applicable else refused).append(change)
    if refused:
        raise ConfigError(
            f"resume from {checkpoint}: {'; '.join(refused)}: these settings cannot change on resume (the run would "
            f"continue as another run, and config.yaml would name values that did not run); resume with the "
            f"checkpoint's values, or start a new run in another {key}. Settings that may change: "
            f"{', '.join(applicable)}")
    return applied
