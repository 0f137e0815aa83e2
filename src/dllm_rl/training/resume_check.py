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
from dllm_rl.config.renames import carry_renamed

# settings of the shared run section that may change on resume (where the run writes, how it reports)
RUN_APPLICABLE = ("run.output_dir", "run.progress", "run.save_every", "run.keep_checkpoints", "run.push_to_hub",
                  "run.report_to", "run.distributed_timeout_s")
# RL / SFT settings that may change on resume: they take effect from the resumed step and change no past step
RL_APPLICABLE = RUN_APPLICABLE + (
    "train.max_steps", "train.max_time_minutes", "train.max_bad_steps", "train.max_skipped_steps",
    "reward.max_failure_steps", "reward.timeout_s", "log.samples_every", "log.rollouts", "model.device",
    "train.num_threads", "model.logprob_chunk_size", "model.gradient_checkpointing", "rollout.batch_size", "eval.every")
SFT_APPLICABLE = RUN_APPLICABLE + (
    "train.max_steps", "train.num_epochs", "train.stop_after", "train.log_every", "train.num_threads", "model.device",
    "objective.logprob_chunk_size", "model.gradient_checkpointing")
#: how a run continues, never compared
RUN_IGNORED = ("run.resume", "run.overwrite")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (dicts of free-form options, e.g. ``estimator_options``, are leaves
    when empty)."""
    if not isinstance(data, dict) or (prefix and not data):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_resumed_config(checkpoint: Path, cfg: Any, applicable: tuple[str, ...],
                         ignored: tuple[str, ...] = RUN_IGNORED, key: str = "run.output_dir") -> list[str]:
    """Compare ``cfg`` with the config saved in ``checkpoint`` (its ``config.yaml``).

    Raises :class:`~dllm_rl.config.ConfigError` naming every changed setting outside ``applicable`` (with
    both values); returns the applied changes as ``"key old -> new"`` (empty when none, or when the
    checkpoint has no config to compare with). Keys the checkpoint's config lacks (a newer setting) are
    taken as given and listed."""
    file = checkpoint / "config.yaml"
    if not file.is_file():
        return []
    # a checkpoint written before keys were renamed: its keys carried to their new place, as a config file's are
    saved = flatten(carry_renamed(type(cfg), yaml.safe_load(file.read_text()) or {}, str(file), warn=False))
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
