"""Training infrastructure shared by the SFT and RL trainers: one module per concern, each documented in its own
docstring.

``accel`` (accelerate set-up, device and dtype), ``backend`` and ``sharding`` (FSDP2 / DeepSpeed ZeRO), ``tied_units``
(FSDP2 units of modules that share weights: DiffusionGemma's encoder/decoder twins), ``ranks``
(what every rank does alike), ``run_config`` (the run section every command shares), ``checkpoint`` (exact resume),
``disk_full`` (a full disk told apart from other write failures), ``run_dir`` (one run per output directory, and the
manifest of what it wrote), ``resume_check`` (a resume's config against the checkpoint's), ``user_paths`` (``~`` in
paths), ``finite`` (the NaN/inf weight check), ``optim`` (AdamW and schedules), ``lora`` (peft), ``ema`` (weight
average), ``sampler`` (resumable data position), ``metrics`` / ``trackers`` / ``plots`` / ``run_log`` (what a run
records and draws).

The names the trainers share are re-exported here (``__all__``); the rest is imported from its module.
"""

from dllm_rl.training.accel import (
    PreparedModel,
    bf16_supported,
    make_accelerator,
    prepare_model,
    resolve_mixed_precision,
)
from dllm_rl.training.checkpoint import (
    TrainerState,
    capture_rng,
    checkpoint_name,
    checkpoint_step,
    clean_leftovers,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from dllm_rl.training.ema import WeightEMA
from dllm_rl.training.lora import (
    LoraOptions,
    apply_lora,
    has_lora,
    load_adapter_weights,
    merged_model,
    merged_state_dict,
    save_adapter,
)
from dllm_rl.training.metrics import (
    METRICS_FILE,
    ZERO_LOSS_NOTE,
    MetricsLogger,
    Progress,
    loss_is_informative,
    read_metrics,
    rl_progress,
)
from dllm_rl.training.optim import OptimConfig, build_optimizer, build_scheduler, parameter_groups
from dllm_rl.training.plots import plot_metrics, write_dashboard
from dllm_rl.training.run_dir import RunDir, RunDirError, open_run_dir
from dllm_rl.training.sampler import IndexStream

__all__ = [
    "METRICS_FILE", "ZERO_LOSS_NOTE", "IndexStream", "LoraOptions", "MetricsLogger", "OptimConfig",
    "PreparedModel", "Progress",
    "RunDir", "RunDirError",
    "TrainerState", "WeightEMA", "prepare_model",
    "apply_lora", "bf16_supported", "build_optimizer", "build_scheduler", "capture_rng", "checkpoint_name",
    "checkpoint_step", "clean_leftovers", "open_run_dir",
    "has_lora", "latest_checkpoint", "list_checkpoints", "load_adapter_weights", "load_checkpoint",
    "make_accelerator", "merged_model", "merged_state_dict", "parameter_groups", "plot_metrics",
    "prune_checkpoints", "read_metrics", "resolve_mixed_precision", "restore_rng", "save_adapter",
    "save_checkpoint", "loss_is_informative", "rl_progress", "write_dashboard",
]
