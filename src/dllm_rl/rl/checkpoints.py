"""Checkpoints of an RL run: the part of :class:`~dllm_rl.rl.trainer.RLTrainer` that saves and resumes (policy,
optimiser, scheduler, data position, weight average, the value model when on, the reward's state (a reward model's
normalisation, a judge's counters) and the trainer's counters) and writes ``final/``."""

from __future__ import annotations

from pathlib import Path

from dllm_rl.config import to_dict
from dllm_rl.hub import push_to_hub
from dllm_rl.models import DiffusionLM
from dllm_rl.models.image_inputs import copy_vq
from dllm_rl.rl.curriculum import enter_stage
from dllm_rl.training import load_checkpoint, merged_model, prune_checkpoints, save_checkpoint
from dllm_rl.training.backend import publishable
from dllm_rl.training.checkpoint import checkpoint_name, save_published
from dllm_rl.training.resume_check import RL_APPLICABLE, check_resumed_config
from dllm_rl.training.run_config import resume_checkpoint
from dllm_rl.training.run_dir import RL_RUN_FILES, RunDir, open_run_dir

# the config keys that name a path of the user's (a leading ~ is expanded)
RL_PATHS = ("model.path", "model.tokenizer", "run.output_dir", "data.train_file", "eval.data", "data.task",
            "run.resume",
            "value_model.init_from")


def open_rl_run_dir(cfg) -> RunDir:
    """Check, lock and prepare the run directory (:func:`~dllm_rl.training.run_dir.open_run_dir`; ``overwrite``
    never deletes the run's inputs) and, when resuming, compare the config with the checkpoint's: refused
    changes end here, before any compute; applied ones are printed."""
    run_dir = open_run_dir(cfg.run.output_dir, RL_RUN_FILES, resume=bool(cfg.run.resume), overwrite=cfg.run.overwrite,
                           inputs={"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer,
                                   "data.train_file": cfg.data.train_file, "eval.data": cfg.eval.data,
                                   "data.task": cfg.data.task, "value_model.init_from": cfg.value_model.init_from})
    try:
        path = resume_checkpoint(cfg.run, run_dir.path)
        applied = check_resumed_config(path, cfg, RL_APPLICABLE) if path is not None else []
        if applied:
            print(f"resume: applied changed settings: {'; '.join(applied)}")
    except BaseException:
        run_dir.close()
        raise
    return run_dir


class RLCheckpoints:
    """Save / resume / final-model methods of the RL trainer (mixed into it; they use its attributes)."""

    def _plain(self) -> DiffusionLM:
        """The policy over its HF module unwrapped from DDP (weights load/save and peft helpers need it)."""
        inner = self.accelerator.unwrap_model(self.model.model)
        if inner is self.model.model:
            return self.model
        return self.model.over(inner)

    def save(self, final: bool = False) -> Path | None:
        self.accelerator.wait_for_everyone()
        path = self.out / "checkpoints" / checkpoint_name(self.step_idx)
        save_checkpoint(path, self._plain(), optimizer=self.optimizer, scheduler=self.scheduler,
                        step=self.step_idx, data_state=self.stream.state_dict(), tokenizer=self.tokenizer,
                        config=to_dict(self.base_cfg),
                        extra={"bad_updates": self.bad_updates, "accuracy_before": self.accuracy_before,
                               "reward": self.reward.state_dict() if self.reward is not None else {},
                               "curriculum": self.curriculum.state_dict()},
                        accelerator=self.accelerator, ema=self.ema, prepared=self.model.model,
                        extra_files=self.value.checkpoint_files() if self.value is not None else None)
        if self.is_main and self.collector.thresholds is not None:  # rollout.decoding=learned: its head too
            self.collector.thresholds.save(path)
        if self.is_main:
            prune_checkpoints(self.out, self.cfg.run.keep_checkpoints)
            self.run_dir.record()
        self.saved_step = self.step_idx
        return path

    def save_last(self) -> None:
        """The checkpoint of the run's last step, unless the loop wrote it already (at a ``save_every`` boundary,
        before the last evaluation) or the run resumed from it: an 8B checkpoint written twice costs minutes."""
        if self.saved_step != self.step_idx:
            self.save()

    def _resume(self) -> None:
        """Continue from the checkpoint ``run.resume`` names (``auto`` without one: nothing to continue)."""
        path = resume_checkpoint(self.cfg.run, self.out)
        if path is None:
            return
        state = load_checkpoint(path, self._plain(), optimizer=self.optimizer, scheduler=self.scheduler,
                                accelerator=self.accelerator, ema=self.ema)
        self.step_idx = state.step
        self.saved_step = state.step
        if self.value is not None:  # its value_model.pt (TraceRL's value model, dllm_rl.rl.value)
            self.value.load(path)
        if self.collector.thresholds is not None:  # rollout.decoding=learned: the checkpoint's head
            self.collector.thresholds.load(path)
        saved = (state.extra or {}).get("curriculum")
        if saved:  # the stage's config, data and prompt stream first, then its position in that stream
            enter_stage(self, int(saved["stage"]))
            self.curriculum.load_state_dict(saved)
        self.stream.load_state_dict(state.data_state)
        self.bad_updates = int((state.extra or {}).get("bad_updates", 0))
        self.accuracy_before = (state.extra or {}).get("accuracy_before")
        if self.reward is not None:  # a reward model's normalisation, a judge's counters
            self.reward.load_state_dict((state.extra or {}).get("reward") or {})
        self.rollouts.truncate(self.step_idx)  # drop what a run killed after this checkpoint wrote
        if self.is_main:
            print(f"resumed from {path} at step {self.step_idx}")

    def save_final_model(self) -> Path:
        """``final/``: the returned weights (the average when ``train.ema_decay`` is on), LoRA merged; uploaded to the
        hub repository ``push_to_hub`` when set. Every rank calls it (the weights are gathered when sharded)."""
        path = self.out / "final"
        with self.averaged():
            plain = publishable(self.accelerator, self.model.model, self._plain())  # collective when sharded
            if self.is_main:
                unwrapped = merged_model(plain) if self.cfg.lora.enabled else plain
                save_published(unwrapped, path, tokenizer=self.tokenizer)  # a full disk: one line
                copy_vq(self.cfg.model.path, path)  # MMaDA: the image tokenizer travels with the model
                if self.collector.thresholds is not None:  # --decoding learned reads it next to the model
                    self.collector.thresholds.save(path)
        if self.is_main:
            if self.cfg.run.push_to_hub:
                print(f"pushed {path} to {push_to_hub(path, self.cfg.run.push_to_hub)}")
        return path
