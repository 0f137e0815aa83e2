"""Training infrastructure shared by the SFT and RL trainers.

API (all importable from ``dllm_rl.training``):

Set-up
    ``make_accelerator(mixed_precision="auto", cpu=False, **kwargs) -> accelerate.Accelerator``
        ``auto`` = bf16 where the device supports it (CUDA bf16 / XPU), else fp32. Without an accelerator
        device ``cpu=True`` is implied (so ``accelerate launch --multi_gpu`` forms gloo ranks). Trainers do gradient
        accumulation themselves (``accelerator.no_sync`` on non-final micro-batches) and step the
        scheduler once per optimizer step (do not ``prepare`` the scheduler).
    ``prepare_model(accelerator, dlm) -> PreparedModel``: ``accelerator.prepare(dlm)`` behind the
        DiffusionLM interface (calls go through DDP/autocast, attributes read the unwrapped model, which is
        ``.unwrapped``); pass it to estimators / objectives for training forwards.
    ``resolve_mixed_precision(requested, cpu=False) -> str``, ``bf16_supported() -> bool``
    ``runs_on_cpu(device) -> bool`` (a trainer's auto | cpu | cuda), ``resolve_device(device) -> torch.device``,
        ``resolve_eval_dtype(dtype, device) -> str`` (in ``dllm_rl.training.accel``)

Ranks (``dllm_rl.training.ranks``)
    ``max_over_ranks(acc, value)``, ``skip_together(acc, skip)``, ``mean_over_ranks(acc, metrics)``,
        ``sum_over_ranks(acc, values)``, ``micro_batches(acc, n, size)`` (padded with empty ones to the most any
        rank has), ``forward_agreement(acc)`` (FSDP2 / ZeRO-3: the scorer's agreement on its number of forwards)

Optimisation
    ``OptimConfig`` (dataclass config section: lr, weight_decay, beta1, beta2, eps, scheduler
        cosine|constant|linear, warmup_steps, min_lr_ratio, max_grad_norm)
    ``build_optimizer(model, cfg) -> torch.optim.AdamW`` (trainable params only; no decay on 1-D params)
    ``build_scheduler(optimizer, cfg, total_steps) -> LambdaLR`` (linear warmup, then the schedule)

LoRA (peft)
    ``LoraOptions`` (enabled, r, alpha, dropout, target_modules = family.lora_target_modules when null)
    ``apply_lora(dlm, opts, seed=0) -> dlm``: wraps ``dlm.model`` in place (it stays at ``dlm.model``); only
        adapters train; the adapter init is seeded (global RNG untouched).
        Reference policy = base weights: ``with dlm.model.disable_adapter(): ...``.
    ``has_lora(dlm)``, ``merged_model(dlm, device="cpu") -> DiffusionLM`` (plain model, adapters merged,
        live model untouched), ``merged_state_dict``, ``save_adapter(dlm, dir)``, ``load_adapter_weights(dlm, dir)``

Checkpoints (exact resume)
    ``save_checkpoint(dir, dlm, *, optimizer=None, scheduler=None, step=0, data_state=None,
        generators=None, tokenizer=None, config=None, extra=None, accelerator=None, ema=None, prepared=None) -> Path``
        Under FSDP2 / DeepSpeed (``prepared``: what ``accelerator.prepare`` returned) model + optimizer shards go
        through ``accelerator.save_state`` into ``sharded/`` (no ``optimizer.pt``) and ``model/`` is gathered to
        rank 0; ``load_checkpoint`` then calls ``accelerator.load_state`` (same backend and world size).
    ``load_checkpoint(dir, dlm, *, optimizer=None, scheduler=None, generators=None, accelerator=None,
        restore_rng_state=True, ema=None) -> TrainerState(step, data_state, extra, path)``
        A checkpoint dir holds ``model/`` (published layout via ``save_model``; LoRA merged into a copy),
        ``adapter/`` (LoRA only), ``optimizer.pt``, ``scheduler.pt``, ``rng_state_rank{R}.pt`` (python,
        numpy, torch, cuda and the named ``generators``), ``trainer_state.json`` (step, data_state, extra,
        world_size, lora), ``config.yaml``. Written to ``<dir>.tmp`` (the state file last), fsync'ed and renamed
        when complete (``DLLM_RL_TEST_KILL_IN_CHECKPOINT=N`` SIGKILLs the process just before that rename:
        for tests).
    ``checkpoint_name(step) -> "step-0000123"``; ``checkpoint_step(path) -> int | None`` (the step of a complete
        checkpoint: name ``step-<digits>``, a readable state file of that step); ``list_checkpoints(out)``,
        ``latest_checkpoint(out)``, ``prune_checkpoints(out, keep)`` look in ``out/checkpoints/`` and see only
        complete checkpoints; ``clean_leftovers(out) -> list[Path]`` deletes the rest (main rank, directory
        locked). ``ema=WeightEMA`` on both saves / restores a weight average as ``ema.pt`` (a checkpoint without
        one starts the average afresh).
    ``capture_rng(generators) / restore_rng(state, generators)``

Sharded backends (``dllm_rl.training.backend``)
    ``setup_backend(acc, micro_batch_size, max_grad_norm)`` after building the Accelerator; ``shard_reference``;
        ``publishable(acc, prepared, dlm)`` (full weights as a plain model on rank 0); ``is_sharded``;
        ``micro_step(acc, prepared, last)`` around each micro-batch and ``backward(acc, prepared, loss)`` (its
        model's own engine under DeepSpeed); ``clip_gradients(acc, prepared, max_norm) -> norm``;
        ``deepspeed_clipping(acc, max_norm)`` around a second model's prepare; ``gathered_parameters``
        (``training.sharding``) around rollouts and no-grad scoring.

Run directory
    ``open_run_dir(path, run_files, *, resume, overwrite, key="output_dir", resume_hint="resume=latest",
        overwrite_hint="overwrite=true", inputs=None) -> RunDir``: refuses a file or a dangling link (``~``
        expanded), locks ``path/.lock`` (``fcntl.flock``, the pid written in it) or refuses a directory another
        run holds, refuses an existing run unless ``resume``, or with ``overwrite`` deletes the files the run
        recorded in ``path/.dllm-rl-run.json`` (never the user's, never an ``inputs`` path); then
        ``clean_leftovers``. ``RunDir.record()`` (at each checkpoint) and ``RunDir.close()`` record what the run
        wrote; ``close`` releases the lock. Errors: ``RunDirError`` (a ValueError). A resume's config is compared
        with the checkpoint's by ``dllm_rl.training.resume_check.check_resumed_config``.
        ``RL_RUN_FILES`` / ``SFT_RUN_FILES`` (in ``dllm_rl.training.run_dir``) name each trainer's files.

Weight average
    ``WeightEMA(module, decay)``: EMA of the trainable parameters; ``update()`` once per step (the first
        ``1/(1-decay)`` updates are a plain running mean), ``with ema.applied(): ...`` swaps the average into
        the live module; ``state_dict()`` / ``load_state_dict()``, ``save(path)`` / ``load(path)``, ``reset()``

Data position
    ``IndexStream(n, seed, shuffle=True)``: ``take(k) -> list[int]``, ``state_dict()`` / ``load_state_dict()``
        (epoch permutations seeded by seed + epoch, so the position is just epoch and offset).

Logging
    ``MetricsLogger(path, *, resume_step=None, enabled=True, report_to=(), config=None).log(step, **metrics)
        -> dict`` (JSON lines, ``resume_step`` drops lines after it; the numbers also go to the ``report_to``
        trackers of :mod:`dllm_rl.training.trackers`), ``close()``; ``read_metrics(path) -> list[dict]``,
        ``METRICS_FILE``; both through :mod:`dllm_rl.jsonl` (a torn last line dropped with a warning)
    ``Progress(total, initial=0, desc="train", disable=False)``: tqdm line with ETA; ``update(steps=1, tokens=0,
        **metrics) -> tokens/s``, ``write(msg)``, ``close()``; ``rl_progress(metrics, held_out=, show_loss=)``
        and ``loss_is_informative(loss_type, loss_aggregation)`` choose an RL step's fields
    ``write_dashboard(run_dirs, out=None) -> Path``: one ``dashboard.png`` (runs overlaid; panels in
        :mod:`dllm_rl.training.plots`); ``plot_metrics(run_dir, keys=None) -> list[Path]``: opt-in
        ``run_dir/plots/<key>.png``
    ``RolloutLog(path, enabled=True)`` (``dllm_rl.training.run_log``): ``log(step, samples)`` appends
        ``rollouts.jsonl`` rows, ``truncate(step)`` drops the rows after a resumed checkpoint
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
