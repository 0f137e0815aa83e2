"""The RL run from start to end: :func:`train` builds an :class:`~dllm_rl.rl.trainer.RLTrainer`, evaluates the
held-out set before, runs the steps (logging metrics and sample rollouts, saving checkpoints), evaluates after,
and writes the final model, the dashboard and ``summary.json``."""

from __future__ import annotations

import json
import time

from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.curriculum import advance
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.training import ZERO_LOSS_NOTE, Progress, loss_is_informative, rl_progress, write_dashboard
from dllm_rl.training.run_dir import interrupted


def _evaluate_after(trainer: RLTrainer, summary: dict, say) -> None:
    """The held-out evaluation after training: of the returned weights, and of the live policy when they are
    the weight average."""
    cfg = trainer.cfg
    after = trainer.evaluate()
    trainer.metrics.log(trainer.step_idx, **after.metrics())
    summary.update(accuracy_after=after.accuracy, nfe_after=after.nfe_mean, tpf_after=after.tokens_per_nfe)
    averaged = trainer.ema is not None and trainer.ema.updates > 0  # none yet: the run ended by train.ema_start
    say(f"held-out accuracy after: {after.accuracy:.3f} ({after.n} items, {after.nfe_mean:.1f} forward passes per "
        f"answer, {after.tokens_per_nfe:.2f} tokens per forward)"
        + (f", weight average (train.ema_decay={cfg.train.ema_decay}, {trainer.ema.updates} updates)"
           if averaged else ""))
    if averaged:  # what the average bought: the last live policy on the same items
        live = trainer.evaluate(live=True)
        summary["accuracy_after_live"] = live.accuracy
        trainer.metrics.log(trainer.step_idx, eval_accuracy_live=live.accuracy)
        say(f"held-out accuracy after, live policy: {live.accuracy:.3f}")


def _evaluate_before(trainer: RLTrainer, summary: dict, say) -> None:
    """The held-out evaluation before training (a resumed run keeps the accuracy its checkpoint holds)."""
    if trainer.step_idx == 0 and trainer.eval_task is not None:
        before = trainer.evaluate()
        trainer.accuracy_before = before.accuracy
        trainer.nfe_before = before.nfe_mean, before.tokens_per_nfe
        trainer.metrics.log(0, **before.metrics())
        say(f"held-out accuracy before: {before.accuracy:.3f} ({before.n} items, {before.nfe_mean:.1f} forward "
            f"passes per answer, {before.tokens_per_nfe:.2f} tokens per forward)")
    if trainer.accuracy_before is not None:  # a resumed run: from its checkpoint
        summary["accuracy_before"] = trainer.accuracy_before
    if trainer.nfe_before is not None:  # (not kept in checkpoints: a resumed run has none)
        summary["nfe_before"], summary["tpf_before"] = trainer.nfe_before


def train(cfg: RLConfig, reward_fn=None) -> dict:
    """Run RL as configured; returns a summary (held-out accuracy before and after, minutes, paths).

    ``reward_fn`` (optional) is a TRL-signature reward ``(prompts, completions, **columns) -> list[float]``
    that replaces the task's built-in reward.
    """
    return run(RLTrainer(cfg, reward_fn=reward_fn))


def run(trainer: RLTrainer) -> dict:
    """The run of a built trainer, start to end (what :func:`train` and ``dllm_rl.RLTrainer.train`` do); the trainer
    is closed after it."""
    try:  # the run directory's lock is released however the run ends
        return _run(trainer)
    except KeyboardInterrupt:  # Ctrl-C: one line naming the step and how to go on (dllm_rl.cli prints it)
        raise interrupted(trainer.out, trainer.step_idx, trainer.cfg.train.max_steps, "run.resume=latest",
                          "run.overwrite=true") from None
    finally:
        trainer.close()


def _run(trainer: RLTrainer) -> dict:
    cfg = trainer.cfg
    t_start = time.perf_counter()
    say = print if trainer.is_main else (lambda *a, **k: None)
    say(f"dllm-rl rl: {cfg.algorithm} ({cfg.estimator}, {cfg.loss_type} loss, {cfg.advantage}) on "
        f"{trainer.model.family.name} [{trainer.model.num_parameters():,} params], task {cfg.data.task}: "
        f"{len(trainer.train_task)} train / "
        + (f"{len(trainer.eval_task)} held-out" if trainer.eval_task is not None else "no held-out (eval.limit=0)"))
    summary: dict = {"algorithm": cfg.algorithm, "model": cfg.model.path, "start_step": trainer.step_idx,
                     "is_main": trainer.is_main}
    if trainer.rollout_note:
        say(trainer.rollout_note)
    _evaluate_before(trainer, summary, say)
    if cfg.rollout.compile and trainer.step_idx < cfg.train.max_steps:
        say("rollout.compile: the first step compiles the rollout model (torch.compile, once; 10-30 s on a CPU)")
    show_loss, held_out = loss_is_informative(cfg.loss_type, cfg.loss_aggregation), trainer.accuracy_before
    bar = Progress(cfg.train.max_steps, initial=trainer.step_idx, desc=f"rl/{cfg.algorithm}",
                   disable=not (cfg.run.progress and trainer.is_main), note=None if show_loss else ZERO_LOSS_NOTE)
    while trainer.step_idx < cfg.train.max_steps:
        if cfg.train.max_time_minutes and (time.perf_counter() - t_start) / 60 > cfg.train.max_time_minutes:
            say(f"time budget of {cfg.train.max_time_minutes} min reached at step {trainer.step_idx}")
            break
        res = trainer.step()
        trainer.step_idx += 1
        m = res.metrics
        if cfg.curriculum.stages:  # a switch takes effect from the next step (and its checkpoint holds it)
            switch = advance(trainer, m["reward"])
            if switch is not None and trainer.is_main:
                bar.write(switch)
            m["curriculum_stage"] = float(trainer.curriculum.stage)
        if (cfg.eval.every and trainer.eval_task is not None and trainer.step_idx % cfg.eval.every == 0
                and trainer.step_idx < cfg.train.max_steps):
            ev = trainer.evaluate()
            m.update(ev.metrics())
        trainer.metrics.log(trainer.step_idx, **m)
        held_out = m.get("eval_accuracy", held_out)
        bar.update(1, tokens=int(m["completion_length"] * m["kept_samples"]),
                   **rl_progress(m, held_out=held_out, show_loss=show_loss))
        trainer.rollouts.log(trainer.step_idx, res.samples)
        if cfg.log.samples_every and trainer.step_idx % cfg.log.samples_every == 0:
            for prompt, completion, reward, reason in res.samples[:2]:
                bar.write(f"  [{reward:.2f}] {prompt.strip()[-60:]!r} -> {completion!r} ({reason})")
        if cfg.run.save_every and trainer.step_idx % cfg.run.save_every == 0:
            trainer.save()
    bar.close()
    summary.update(steps=trainer.step_idx, minutes=(time.perf_counter() - t_start) / 60,
                   output_dir=str(trainer.out))
    if trainer.eval_task is not None:
        _evaluate_after(trainer, summary, say)
    trainer.save_last()
    summary["final_model"] = str(trainer.save_final_model())
    if trainer.is_main:
        summary["plots"] = [str(write_dashboard([trainer.out]))] if cfg.log.dashboard else []
        (trainer.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
