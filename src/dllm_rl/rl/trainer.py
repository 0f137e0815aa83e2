"""The RL trainer: rollout -> reward -> advantages -> ``train.num_iterations`` optimisation passes, in one process
per rank over the same in-memory weights (no subprocess per stage, no reload between stages).

Read top to bottom: :class:`RLTrainer` sets everything up, and :meth:`RLTrainer.step` is one RL step in two
stages: :meth:`~RLTrainer.collect` (rollout rounds, rewards, the rollout hook, dynamic sampling, advantages:
:mod:`dllm_rl.rl.collect`) hands a :class:`~dllm_rl.rl.collect.StepBatch` to :meth:`~RLTrainer.update` (the value
model's targets, the micro-batch engine with its rank padding: :mod:`dllm_rl.rl.update`, the value model's fit,
the weight check; a step left with nothing to train on: :mod:`dllm_rl.rl.skipped_steps`). The run from start to
end is :func:`dllm_rl.rl.loop.train`; checkpoints are :mod:`dllm_rl.rl.checkpoints`.

Randomness: every stream is derived from ``(seed, step, sample)`` — prompt order (``IndexStream``),
rollout noise (one generator per sequence) and estimator masks (one seed per sample, or per prompt group
with ``estimator_noise=group``, shared by the old, reference and current policy: common random numbers, so at
the first pass every ratio is exactly 1).
A run resumed from a checkpoint therefore replays exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from accelerate.utils import DistributedDataParallelKwargs

from dllm_rl.config import ConfigError, save_config, to_dict
from dllm_rl.eval.heldout import HeldOut, check_not_empty, heldout_accuracy
from dllm_rl.models import DiffusionLM, detect_family, load_model, load_tokenizer
from dllm_rl.models.devices import resolve_eval_dtype
from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.models.loading import read_config
from dllm_rl.models.moe import freeze_routers, router_stats
from dllm_rl.rewards.reward_terms import build_reward
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.block_size import run_block_sizes
from dllm_rl.rl.checkpoints import RL_PATHS, RLCheckpoints, open_rl_run_dir
from dllm_rl.rl.collect import RolloutCollector, StepBatch
from dllm_rl.rl.config import RLConfig, decode_config, rollout_engine
from dllm_rl.rl.curriculum import Curriculum, check_stages
from dllm_rl.rl.hooks import make_hook, samples_per_prompt
from dllm_rl.rl.rollout_copy import RolloutCopy, rollout_dtype
from dllm_rl.rl.run_checks import PromptLengths, check_model_settings, check_prompts
from dllm_rl.rl.skipped_steps import count_skipped
from dllm_rl.rl.update import PolicyUpdater
from dllm_rl.rl.value import ValueLearner
from dllm_rl.tasks import get_task
from dllm_rl.threads import use_cpu_threads
from dllm_rl.training import (
    IndexStream,
    MetricsLogger,
    WeightEMA,
    apply_lora,
    build_optimizer,
    build_scheduler,
    make_accelerator,
)
from dllm_rl.training.accel import training_device
from dllm_rl.training.backend import refuse_unsharded_features, setup_backend, shard_reference
from dllm_rl.training.finite import Guarded, WeightGuard
from dllm_rl.training.ranks import max_over_ranks, mean_over_ranks
from dllm_rl.training.run_log import ROLLOUTS_FILE, RolloutLog
from dllm_rl.training.sharding import gathered_parameters
from dllm_rl.training.user_paths import expand_user

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    metrics: dict
    samples: list[tuple[str, str, float, str]]


def check_scored(task, cfg: RLConfig) -> None:
    """A task without a verifier (``chat``) needs the run to score it (a reward model, judge, terms or function),
    and no held-out accuracy (which a verifier gives): a ConfigError before any rollout otherwise."""
    if task.has_verifier:
        return
    if task.custom_reward is None and not cfg.reward.combined:
        raise ConfigError(f"data.task: the {task.name} task has no verifier; score it with reward.model, "
                          "reward.judge.model, reward.terms or reward.function")
    if cfg.eval.limit != 0:
        raise ConfigError(f"eval.limit: the {task.name} task has no verifier for held-out accuracy; set "
                          "eval.limit=0 (each step logs the run's reward)")


class RLTrainer(RLCheckpoints):
    """Holds the policy, optional reference, optimiser, data stream and logger of one run (its checkpoints:
    :class:`~dllm_rl.rl.checkpoints.RLCheckpoints`)."""

    def __init__(self, cfg: RLConfig, reward_fn=None):
        cfg = expand_user(cfg, RL_PATHS)
        if not cfg.model.path:
            raise ConfigError("model.path: set the checkpoint directory (model.path=PATH)")
        family = detect_family(read_config(cfg.model.path), f"{cfg.model.path}/config.json")
        self.cfg = cfg = resolve(cfg, family.attention, family)  # every config error before anything heavy
        # DDP: no buffer broadcast before each forward (the only buffers are rotary tables, equal on every
        # rank), so ranks may run different numbers of forwards (uneven eval shards, dynamic decoding).
        self.accelerator = make_accelerator(
            cpu=training_device(cfg.model.device, "model.device"), timeout_s=cfg.run.distributed_timeout_s,
            kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
        backend = setup_backend(self.accelerator, cfg.train.micro_batch_size, cfg.optim.max_grad_norm)
        if family.noise == "uniform" and backend not in ("single", "ddp", "fsdp2"):
            raise ConfigError(f"model.path: a {family.name} model trains with RL in one process, under DDP or "
                              f"FSDP2, not {backend} (its estimators call the encoder and decoder directly); launch "
                              "with configs/accelerate/ddp.yaml or fsdp2.yaml")
        self.chunk_size = cfg.model.logprob_chunk_size
        self.out = Path(cfg.run.output_dir)
        self.is_main = self.accelerator.is_main_process
        # refused (a file, another run's, an old run without resume/overwrite), locked and cleaned before compute
        # and a resume's config compared with the checkpoint's
        self.run_dir = open_rl_run_dir(cfg) if self.is_main else None
        self.accelerator.wait_for_everyone()
        try:
            self._build(reward_fn)
        except BaseException:
            self.close()
            raise

    def _build(self, reward_fn) -> None:
        self._build_models(reward_fn)
        self._prepare()

    def _build_models(self, reward_fn) -> None:
        """The policy (LoRA, routers), tasks, hook, reference copy, optimiser, schedule and value model."""
        cfg = self.cfg
        device = self.accelerator.device
        self.model = load_model(cfg.model.path, dtype=resolve_eval_dtype(cfg.model.dtype, device), device=device,
                                tokenizer_dir=cfg.model.tokenizer)
        use_cpu_threads(self.accelerator.device, cfg.train.num_threads)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path, mask_token_id=self.model.mask_token_id,
                                        noise=self.model.family.noise)
        check_model_settings(cfg, self.model)  # the sampler's and estimator's settings: before any data or forward
        reward = reward_fn if reward_fn is not None else cfg.reward.function
        self.train_task = get_task(cfg.data.task, data=cfg.data.train_file, split="train",
                                   prompt_style=cfg.data.prompt_style,
                                   limit=cfg.data.train_limit, reward_fn=reward)
        self.eval_task = None if cfg.eval.limit == 0 else get_task(  # eval.limit=0: no held-out evaluation
            cfg.data.task, data=cfg.eval.data, split=cfg.eval.split, prompt_style=cfg.data.prompt_style,
            limit=cfg.eval.limit,
            reward_fn=reward)
        check_not_empty(self.train_task, "training", "data.train_file")
        check_scored(self.train_task, cfg)
        if self.eval_task is not None:
            check_not_empty(self.eval_task, "held-out", "eval.data")
        # the prompts against the context (the curriculum's stages run both checks too: check_stages)
        self.prompt_lengths = PromptLengths(self.tokenizer)
        check_prompts(cfg, self.model, self.prompt_lengths, self.train_task, self.eval_task)
        # reward terms, reward model, judge: loaded and checked now, before any rollout (None: the task's reward)
        self.reward = build_reward(cfg.reward.terms, cfg.reward, cfg.reward.judge, task=self.train_task,
                                   policy_tokenizer=self.tokenizer) if cfg.reward.combined else None
        if cfg.lora.enabled:
            apply_lora(self.model, cfg.lora)
        self.rollout_hook = make_hook(cfg.rollout_hook, cfg.rollout_hook_options)
        own_rows = self.rollout_hook is not None and self.rollout_hook.makes_training_rows
        if own_rows and (cfg.value_model.enabled or cfg.dynamic_sampling):
            key = "value_model.enabled" if cfg.value_model.enabled else "dynamic_sampling"
            raise ConfigError(f"{key}: rollout hook {cfg.rollout_hook!r} trains on rows of its own, not on the "
                              f"samples that {key} works on; turn {key} off")
        self.reference = None
        if cfg.beta > 0 and cfg.reference == "copy":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        if cfg.model.freeze_router:
            freeze_routers(self.model.model)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.optimizer = build_optimizer(self.model.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.total_optimizer_steps())
        # The value model copies the policy before it is prepared (FSDP2 shards the policy in place), and is
        # prepared with this accelerator, so that sharded checkpoints' save_state holds it too.
        self.value = ValueLearner(cfg, self.model, self.accelerator) if cfg.value_model.enabled else None

    def _prepare(self) -> None:
        """Shard the policy (and reference) with the launch's backend; everything that reads the prepared model."""
        cfg = self.cfg
        self.model.model, self.optimizer = self.accelerator.prepare(self.model.model, self.optimizer)
        if self.reference is not None:
            shard_reference(self.accelerator, self.reference)
        self.weight_guard = WeightGuard(self.accelerator, {  # the check after each step's update (training/finite)
            "policy": Guarded(self.model.model, "optim.lr", cfg.optim.lr),
            "value model": Guarded(self.value.module if self.value is not None else None, "value_model.lr",
                                   getattr(self.value, "lr", 0.0))})
        decode_dtype, self.rollout_note = rollout_dtype(cfg.rollout.dtype, self.model.dtype, self.accelerator.device)
        refuse_unsharded_features(self.accelerator, ema_decay=cfg.train.ema_decay > 0,
                                  **{"rollout.dtype / rollout.compile": decode_dtype != self.model.dtype
                                     or cfg.rollout.compile})
        self.ema = WeightEMA(self._plain().model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None
        first_average = cfg.train.ema_start + cfg.train.ema_every
        if self.ema is not None and first_average > cfg.train.max_steps:
            logger.warning("the weight average's first update is at step %d, after train.max_steps=%d (train."
                           "ema_start / ema_every): the run returns the live policy", first_average,
                           cfg.train.max_steps)
        self.rollout_copy = None
        if decode_dtype != self.model.dtype or cfg.rollout.compile:
            self.rollout_copy = RolloutCopy(self._plain(), decode_dtype, compile=cfg.rollout.compile)
        # TraceRL's block-size adaptation: rollouts at one block, the training layout at a multiple of it
        _, self.train_block, _ = run_block_sizes(cfg, self.model.block_size)  # checks all three
        self.stream = IndexStream(len(self.train_task), seed=cfg.run.seed)
        self.step_idx = 0
        self.saved_step: int | None = None  # the step of the last checkpoint written or resumed from
        self.skipped_steps = 0  # steps in a row without an update (no group with reward signal)
        # the step's two stages: rollouts -> rewards -> advantages, then the optimisation passes
        self.prompts = PromptEncoder(self.tokenizer, cfg.model.path)  # image prompts: ids and features (MMaDA's VQ)
        self.collector = RolloutCollector(cfg, self.accelerator, self.model, self.tokenizer, self.train_task,
                                          self.rollout_hook, self.stream, self._gathered, self.prompts,
                                          reward=self.reward)
        if cfg.rollout.decoding == "learned":  # DiFFPO's per-prompt threshold, trained with the policy
            from dllm_rl.rl.learned_threshold import ThresholdLearner

            self.collector.thresholds = ThresholdLearner(cfg, self.model)
        self.updater = PolicyUpdater(cfg, self.accelerator, self.model, self.reference, self.optimizer,
                                     self.scheduler, self.train_block, self._gathered)
        self.accuracy_before: float | None = None  # held-out accuracy at step 0 (kept in checkpoints)
        self.nfe_before: tuple[float, float] | None = None  # its passes per answer and tokens per forward
        # the curriculum's stages change self.cfg; checkpoints and config.yaml keep the config as given
        self.base_cfg, self.curriculum = cfg, Curriculum(cfg.curriculum)
        self.collector.curriculum = self.curriculum
        check_stages(self)
        self.rollouts = RolloutLog(self.out / ROLLOUTS_FILE, enabled=self.is_main)
        if cfg.run.resume:
            self._resume()
        self.metrics = MetricsLogger(self.out / "metrics.jsonl", resume_step=self.step_idx, enabled=self.is_main,
                                     report_to=cfg.run.report_to, config=to_dict(cfg))
        if self.is_main:
            save_config(cfg, self.out / "config.yaml")

    # ------------------------------------------------------------------------------------ sizes
    def micro_batches_per_pass(self, n: int) -> int:
        return max(1, math.ceil(n / self.cfg.train.micro_batch_size))

    def total_optimizer_steps(self) -> int:
        n = self.cfg.train.prompts_per_step * samples_per_prompt(self.rollout_hook, self.cfg.rollout.num_generations)
        per_pass = self.micro_batches_per_pass(n)
        accum = self.cfg.train.gradient_accumulation_steps or per_pass
        return self.cfg.train.max_steps * self.cfg.train.num_iterations * math.ceil(per_pass / accum)

    # --------------------------------------------------------------------------------- one step
    def step(self) -> StepResult:
        """One RL step in its two stages: :meth:`collect` -> a :class:`~dllm_rl.rl.collect.StepBatch` ->
        :meth:`update`; then the step's metrics, averaged over the ranks."""
        batch = self.collect()
        update, t_update = self.update(batch)
        return StepResult(self._metrics(batch, update, t_update), self._samples(batch))

    def collect(self) -> StepBatch:
        """Rollouts, rewards and advantages of this step (:mod:`dllm_rl.rl.collect`), with the policy's in-memory
        weights, or its ``rollout.dtype`` / ``compile`` copy refreshed from them."""
        t0 = time.perf_counter()
        policy = self.rollout_copy.refresh() if self.rollout_copy is not None else self.model
        t_refresh = time.perf_counter() - t0
        batch = self.collector.collect(policy, self.step_idx)
        batch.t_rollout += t_refresh
        return batch

    def update(self, batch: StepBatch) -> tuple[dict, float]:
        """The optimisation passes over the kept samples (:mod:`dllm_rl.rl.update`), the value model's targets
        before them and its fit after, the weight check and the weight average; skipped only when no rank kept a
        sample (a rank with none still joins the others' all-reduces). Returns the metrics and the seconds."""
        t0 = time.perf_counter()
        rollout, keep, adv, mask_seeds = batch.trained()  # the kept samples, or a rollout hook's training rows
        any_kept = max_over_ranks(self.accelerator, len(keep)) > 0
        self.skipped_steps = count_skipped(self.cfg, self.skipped_steps, any_kept, self.step_idx, batch.filt,
                                           batch.rejected, self.collector.group_size)
        if any_kept:  # the weights' norms before the update, which the weight check compares with
            self.weight_guard.before()
        scoring = self.updater.batch(rollout, keep, mask_seeds) if self.value and any_kept else None
        if scoring is not None:  # the values before any update; their GAE token advantages replace `adv`
            targets, adv = self.value.token_advantages(scoring, batch.rewards, keep, batch.step_scores)
        result = (self.updater.run(rollout, keep, adv, mask_seeds, self.step_idx) if any_kept
                  else {"skipped_step": 1.0})
        if self.collector.thresholds is not None:  # the threshold head's policy-gradient step, on the same advantages
            result.update(self.collector.thresholds.update(batch.advantages, batch.keep))
        if scoring is not None:  # after the policy update, which used the values from before it
            result.update(self.value.fit(scoring, targets))
        if any_kept:  # NaN/inf weights, or norms that exploded or collapsed: stop, naming the step and the lr
            self.weight_guard.check(self.step_idx + 1)
        since_start = self.step_idx + 1 - self.cfg.train.ema_start  # this is step step_idx + 1
        if self.ema is not None and since_start > 0 and since_start % self.cfg.train.ema_every == 0:
            self.ema.update()
        return result, time.perf_counter() - t0

    @property
    def bad_updates(self) -> int:
        """Updates skipped for a NaN/inf loss over the run (kept in checkpoints)."""
        return self.updater.bad_updates

    @bad_updates.setter
    def bad_updates(self, value: int) -> None:
        self.updater.bad_updates = value

    def _metrics(self, batch: StepBatch, update: dict, t_update: float) -> dict:
        """The step's metrics, averaged over the ranks."""
        cfg, rollout, rewards = self.cfg, batch.rollout, batch.rewards
        lengths = rollout.completion_lengths().float()
        m = {
            "reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "accuracy": float((rewards >= 1.0).float().mean()),
            "completion_length": float(lengths.mean()), "nfe": float(rollout.nfe.float().mean()),
            "tpf": float(rollout.tokens_per_forward().mean()),
            "rollout_tokens_per_s": float(lengths.sum()) / max(batch.t_rollout, 1e-9),
            "kept_samples": float(len(batch.keep)), "rejected_samples": float(batch.rejected),
            "zero_variance_groups": float(batch.filt.zero_variance_groups),
            "out_of_band_groups": float(batch.filt.out_of_band_groups),
            "narrow_tpf_groups": float(batch.filt.narrow_tpf_groups),
            "time_rollout": batch.t_rollout, "time_reward": batch.t_reward, "time_update": t_update,
            "lr": float(self.scheduler.get_last_lr()[0]),
        }
        if batch.policy_rewards is not None:  # a rollout hook ran: the policy's own samples' reward beside it
            m["reward_policy"] = sum(batch.policy_rewards) / max(len(batch.policy_rewards), 1)
        if cfg.dynamic_sampling:
            m.update(sampling_rounds=float(batch.rounds), surplus_groups=float(batch.surplus))
        m.update(batch.hook_stats)
        m.update(update)
        m.update(batch.reward_health)
        if self.model.family.moe:  # router load and entropy over the rollouts' real tokens
            dev = self.accelerator.device
            m.update(router_stats(self._plain(), torch.cat([rollout.prompt_ids, rollout.completion_ids], 1).to(dev),
                                  torch.cat([rollout.prompt_mask, rollout.completion_mask], 1).to(dev)))
        return mean_over_ranks(self.accelerator, m)

    def _samples(self, batch: StepBatch) -> list[tuple[str, str, float, str]]:
        """The first ``log.rollouts`` samples as (prompt, completion, reward, reason)."""
        n = min(self.cfg.log.rollouts, len(batch.rewards))
        return [(batch.prompts[i], batch.rollout.texts[i], batch.reward_values[i], batch.reasons[i])
                for i in range(n)]

    # ----------------------------------------------------------------------------- evaluation
    def averaged(self, live: bool = False):
        """A context in which the policy holds the returned weights: the weight average when ``train.ema_decay``
        is on (unless ``live``), else the live weights."""
        return self.ema.applied() if self.ema is not None and not live else contextlib.nullcontext()

    def evaluate(self, live: bool = False) -> HeldOut:
        """Held-out accuracy of the returned weights (the average, when on), or of the ``live`` policy."""
        cfg = self.cfg
        if self.eval_task is None:
            raise ConfigError("eval.limit: 0 turns the held-out evaluation off; set eval.limit >= 1 to evaluate")
        examples = self.eval_task.examples
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        mine = examples[rank::world]
        gathered = self._gathered(self.model)
        with self.averaged(live), torch.no_grad(), gathered:
            res = heldout_accuracy(self.model, self.tokenizer, self.eval_task, mine,
                                   decode_config(cfg, self.model, evaluation=True),
                                   batch_size=cfg.rollout.batch_size, seed=cfg.run.seed, prompts=self.prompts,
                                   engine=rollout_engine(cfg))
        if world > 1:
            vals = mean_over_ranks(self.accelerator, {"accuracy": res.accuracy * res.n, "reward": res.reward * res.n,
                                                      "nfe": res.nfe_mean * res.n, "tokens": res.mean_length * res.n,
                                                      "n": float(res.n)})
            total = vals["n"] * world
            if total > 0:  # (every rank's shard is empty only if the task is, which the constructor refuses)
                res = replace(res, accuracy=vals["accuracy"] * world / total,
                              reward=vals["reward"] * world / total, n=int(round(total)),
                              nfe_mean=vals["nfe"] * world / total, mean_length=vals["tokens"] * world / total,
                              nfe_per_token=vals["nfe"] / max(vals["tokens"], 1e-9))
        return res

    def _gathered(self, dlm: DiffusionLM | None):
        """Full parameters of ``dlm`` (the policy or the reference) for no-grad forwards whose number may
        differ between ranks (rollouts, evaluation, old / reference scores); a no-op unless FSDP2 / ZeRO-3.
        Rollouts and evaluation decode with the gathered policy, not a rollout copy, under those backends."""
        if dlm is None or dlm is not self.model and dlm is not self.reference:
            return contextlib.nullcontext()  # a rollout copy: plain tensors already
        return gathered_parameters(self.accelerator, dlm.model)

    def close(self) -> None:
        """Finish the trackers and release the run directory (its lock) for another run."""
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        if self.run_dir is not None:
            self.run_dir.close()

