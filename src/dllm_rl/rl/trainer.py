"""The RL trainer: rollout -> reward -> advantages -> ``num_iterations`` optimisation passes, in one process
per rank over the same in-memory weights (no subprocess per stage, no reload between stages).

Read top to bottom: :class:`RLTrainer` sets everything up, :meth:`RLTrainer.step` is one RL step; the run from
start to end is :func:`dllm_rl.rl.loop.train`.

Longer than the project's 400 lines on purpose: one RL step (rollout rounds, the rollout hook, the value
model's advantages, the micro-batched update with its rank bookkeeping: samples numbered over all ranks, padding
micro-batches, losses normalised over all ranks, non-finite losses agreed before any backward) reads best in one
file, since every rank must take each of its branches alike; the run loop, checkpoint glue, rank and backend
helpers, value model and hooks already live in their own modules.

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
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from accelerate.utils import DistributedDataParallelKwargs, gather_object

from dllm_rl.config import ConfigError, save_config, to_dict
from dllm_rl.estimators import ScoringBatch, TokenScores, estimate
from dllm_rl.eval.heldout import HeldOut, check_not_empty, encode_prompts, heldout_accuracy
from dllm_rl.models import DiffusionLM, detect_family, load_model, load_tokenizer
from dllm_rl.models.loading import read_config
from dllm_rl.models.moe import freeze_routers, router_stats
from dllm_rl.rl.advantages import compute_advantages, group_filter
from dllm_rl.rl.algorithms import check_estimator_options, resolve
from dllm_rl.rl.block_size import run_block_sizes
from dllm_rl.rl.checkpoints import RL_PATHS, RLCheckpoints, open_rl_run_dir
from dllm_rl.rl.config import RLConfig, decode_config
from dllm_rl.rl.draw_backward import backward_by_draw
from dllm_rl.rl.hooks import HookContext, RoundView, make_hook
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig
from dllm_rl.rl.rewards import safe_rewards, safe_scores
from dllm_rl.rl.rollout_copy import RolloutCopy, rollout_dtype
from dllm_rl.rl.value import ValueLearner, steps_after_hook
from dllm_rl.sampling import Rollout, generate_batched
from dllm_rl.seeding import ESTIMATOR_MASKS, HOOK_ROLLOUTS, derive_seed
from dllm_rl.tasks import get_task
from dllm_rl.tasks.base import RewardError
from dllm_rl.training import (
    IndexStream,
    MetricsLogger,
    WeightEMA,
    apply_lora,
    build_optimizer,
    build_scheduler,
    make_accelerator,
)
from dllm_rl.training.accel import runs_on_cpu
from dllm_rl.training.backend import (
    backward,
    clip_gradients,
    discard_gradients,
    micro_step,
    refuse_unsharded_features,
    setup_backend,
    shard_reference,
)
from dllm_rl.training.finite import TrainingStopped, nonfinite_weights
from dllm_rl.training.ranks import (
    forward_agreement,
    max_over_ranks,
    mean_over_ranks,
    micro_batches,
    skip_together,
    sum_over_ranks,
)
from dllm_rl.training.run_log import ROLLOUTS_FILE, RolloutLog
from dllm_rl.training.sharding import gathered_parameters
from dllm_rl.training.user_paths import expand_user

logger = logging.getLogger(__name__)


@dataclass
class _Round:
    """One batch of prompts rolled out and rewarded (a step has one, or several with dynamic_sampling)."""

    rollout: Rollout
    rewards: list[float]
    reasons: list[str]
    seeds: list[int]  # per sample: its rollout noise, and its estimator masks
    prompts: list[str]  # per sample: its prompt text
    t_rollout: float
    t_reward: float
    stats: dict[str, float] = field(default_factory=dict)  # the rollout hook's numbers
    step_scores: list[list[float] | None] | None = None  # per sample: process rewards per decoding step
    reward_failed: int = 0  # samples whose reward raised or timed out (scored 0)
    reward_nonfinite: int = 0  # NaN / inf / None rewards (scored 0)
    reward_error: str = ""  # the reward's last failure


@dataclass
class StepResult:
    metrics: dict
    samples: list[tuple[str, str, float, str]]


class RLTrainer(RLCheckpoints):
    """Holds the policy, optional reference, optimiser, data stream and logger of one run (its checkpoints:
    :class:`~dllm_rl.rl.checkpoints.RLCheckpoints`)."""

    def __init__(self, cfg: RLConfig, reward_fn=None):
        cfg = expand_user(cfg, RL_PATHS)
        if not cfg.model:
            raise ConfigError("model: set the checkpoint directory (model=PATH)")
        family = detect_family(read_config(cfg.model), f"{cfg.model}/config.json")
        self.cfg = cfg = resolve(cfg, family.attention)  # every config error before anything heavy
        # DDP: no buffer broadcast before each forward (the only buffers are rotary tables, equal on every
        # rank), so ranks may run different numbers of forwards (uneven eval shards, dynamic decoding).
        self.accelerator = make_accelerator(
            cpu=runs_on_cpu(cfg.device), timeout_s=cfg.distributed_timeout_s,
            kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
        setup_backend(self.accelerator, cfg.micro_batch_size, cfg.optim.max_grad_norm)
        self.chunk_size = cfg.logprob_chunk_size
        self.out = Path(cfg.output_dir)
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
        self.model = load_model(cfg.model, dtype=cfg.dtype, device=self.accelerator.device,
                                tokenizer_dir=cfg.tokenizer)
        self.tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, mask_token_id=self.model.mask_token_id)
        for evaluation in (False, True):  # the sampler's settings need the model: checked before any forward
            decode_config(cfg, self.model, evaluation=evaluation)
        check_estimator_options(cfg, self.model)
        reward = reward_fn if reward_fn is not None else cfg.reward
        self.train_task = get_task(cfg.task, data=cfg.train_data, split="train", prompt_style=cfg.prompt_style,
                                   limit=cfg.train_limit, reward_fn=reward)
        self.eval_task = None if cfg.eval.limit == 0 else get_task(  # eval.limit=0: no held-out evaluation
            cfg.task, data=cfg.eval.data, split=cfg.eval.split, prompt_style=cfg.prompt_style, limit=cfg.eval.limit,
            reward_fn=reward)
        check_not_empty(self.train_task, "training", "train_data")
        if self.eval_task is not None:
            check_not_empty(self.eval_task, "held-out", "eval.data")
        if cfg.lora.enabled:
            apply_lora(self.model, cfg.lora)
        self.rollout_hook = make_hook(cfg.rollout_hook, cfg.rollout_hook_options)
        self.reference = None
        if cfg.beta > 0 and cfg.reference == "copy":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        if cfg.freeze_router:
            freeze_routers(self.model.model)
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
        decode_dtype, self.rollout_note = rollout_dtype(cfg.rollout.dtype, self.model.dtype, self.accelerator.device)
        refuse_unsharded_features(self.accelerator, ema_decay=cfg.ema_decay > 0,
                                  **{"rollout.dtype / rollout.compile": decode_dtype != self.model.dtype
                                     or cfg.rollout.compile})
        self.ema = WeightEMA(self._plain().model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        self.rollout_copy = None
        if decode_dtype != self.model.dtype or cfg.rollout.compile:
            self.rollout_copy = RolloutCopy(self._plain(), decode_dtype, compile=cfg.rollout.compile)
        # TraceRL's block-size adaptation: rollouts at one block, the training layout at a multiple of it
        _, self.train_block, _ = run_block_sizes(cfg, self.model.block_size)  # checks all three
        self.stream = IndexStream(len(self.train_task), seed=cfg.seed)
        self.step_idx = 0
        self.bad_updates = 0
        self.skipped_steps = 0  # steps in a row without an update (no group with reward signal)
        self.reward_failed_steps = 0  # steps in a row whose reward failed on every sample
        self.grad_norms: list[float] = []  # pre-clipping gradient norms of the current step
        self.accuracy_before: float | None = None  # held-out accuracy at step 0 (kept in checkpoints)
        self.rollouts = RolloutLog(self.out / ROLLOUTS_FILE, enabled=self.is_main)
        if cfg.resume:
            self._resume(cfg.resume)
        self.metrics = MetricsLogger(self.out / "metrics.jsonl", resume_step=self.step_idx, enabled=self.is_main,
                                     report_to=cfg.report_to, config=to_dict(cfg))
        if self.is_main:
            save_config(cfg, self.out / "config.yaml")

    # ------------------------------------------------------------------------------------ sizes
    def micro_batches_per_pass(self, n: int) -> int:
        return max(1, math.ceil(n / self.cfg.micro_batch_size))

    def total_optimizer_steps(self) -> int:
        n = self.cfg.prompts_per_step * self.cfg.num_generations
        per_pass = self.micro_batches_per_pass(n)
        accum = self.cfg.gradient_accumulation_steps or per_pass
        return self.cfg.max_steps * self.cfg.num_iterations * math.ceil(per_pass / accum)

    # --------------------------------------------------------------------------------- one step
    def step(self) -> StepResult:
        cfg = self.cfg
        t0 = time.perf_counter()
        G, target = cfg.num_generations, cfg.prompts_per_step
        # 1-3. prompts -> rollouts -> rewards, one round or (dynamic_sampling) until `target` groups have signal
        rounds: list[_Round] = []
        signal = 0
        t_reward = 0.0
        # the rollouts' weights: the policy, or its rollout.dtype/compile copy refreshed from it
        policy = self.rollout_copy.refresh() if self.rollout_copy is not None else self.model
        t_rollout = time.perf_counter() - t0
        for r in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            # every rank draws each round's prompts, so the ranks' prompt streams stay in step
            idx = self.stream.take(cfg.prompts_per_step * self.accelerator.num_processes)
            if signal < target:
                rnd = self._rollout_round(policy, idx, first_sample=r * len(idx) * G)
                rounds.append(rnd)
                t_rollout, t_reward = t_rollout + rnd.t_rollout, t_reward + rnd.t_reward
                signal += int(self._filter(torch.tensor(rnd.rewards)).keep.view(-1, G)[:, 0].sum())
            if not cfg.dynamic_sampling or max_over_ranks(self.accelerator, int(signal < target)) == 0:
                break
        rollout = Rollout.cat([x.rollout for x in rounds]) if len(rounds) > 1 else rounds[0].rollout
        rewards_list = [v for x in rounds for v in x.rewards]
        rewards = torch.tensor(rewards_list, dtype=torch.float32)
        seeds = [s for x in rounds for s in x.seeds]
        prompts_rep = [p for x in rounds for p in x.prompts]
        reasons = [why for x in rounds for why in x.reasons]
        step_scores = [s for x in rounds for s in (x.step_scores or [None] * len(x.rewards))]
        reward_health = self._check_rewards(rounds)

        # 4. advantages; groups with no signal are dropped (and counted), and with dynamic_sampling the groups
        # with signal beyond `target` (the last round's surplus)
        adv = self._advantages(rewards)
        filt = self._filter(rewards)
        keep_group = filt.keep.view(-1, G)[:, 0]
        surplus = 0
        if cfg.dynamic_sampling:
            within = keep_group & (keep_group.long().cumsum(0) <= target)
            surplus, keep_group = int((keep_group & ~within).sum()), within
        keep = torch.nonzero(keep_group.repeat_interleave(G)).flatten()

        # 5. optimisation passes over the kept samples
        # skipped only when no rank kept a sample (a rank with none still joins the others' all-reduces)
        any_kept = max_over_ranks(self.accelerator, len(keep)) > 0
        self._count_skipped(any_kept, filt)
        # the estimator's masks: one random stream per sample, or per prompt group (shared by its G samples)
        mask_seeds = seeds if cfg.estimator_noise == "sample" else [seeds[j - j % G] for j in range(len(seeds))]
        t_update = time.perf_counter()
        batch = self._batch(rollout, keep, mask_seeds) if self.value is not None and any_kept else None
        if batch is not None:  # the values before any update; their GAE token advantages replace `adv`
            targets, adv = self.value.token_advantages(batch, rewards, keep, step_scores)
        update = self._update(rollout, keep, adv, mask_seeds) if any_kept else {"skipped_step": 1.0}
        if batch is not None:  # after the policy update, which used the values from before it
            update.update(self.value.fit(batch, targets))
        if any_kept:
            self._check_weights()
        if self.ema is not None:
            self.ema.update()
        t_update = time.perf_counter() - t_update

        lengths = rollout.completion_lengths().float()
        gen_tokens = float(lengths.sum())
        m = {
            "reward": float(rewards.mean()), "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "accuracy": float((rewards >= 1.0).float().mean()),
            "completion_length": float(lengths.mean()), "nfe": float(rollout.nfe.float().mean()),
            "rollout_tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
            "kept_samples": float(len(keep)), "zero_variance_groups": float(filt.zero_variance_groups),
            "out_of_band_groups": float(filt.out_of_band_groups),
            "time_rollout": t_rollout, "time_reward": t_reward, "time_update": t_update,
            "lr": float(self.scheduler.get_last_lr()[0]),
        }
        if cfg.dynamic_sampling:
            m.update(sampling_rounds=float(len(rounds)), surplus_groups=float(surplus))
        for k in sorted({k for x in rounds for k in x.stats}):
            m[k] = sum(x.stats.get(k, 0.0) for x in rounds)
        m.update(update)
        m.update(reward_health)
        if self.model.family.moe:  # router load and entropy over the rollouts' real tokens
            dev = self.accelerator.device
            m.update(router_stats(self._plain(), torch.cat([rollout.prompt_ids, rollout.completion_ids], 1).to(dev),
                                  torch.cat([rollout.prompt_mask, rollout.completion_mask], 1).to(dev)))
        m = mean_over_ranks(self.accelerator, m)
        samples = [(prompts_rep[i], rollout.texts[i], rewards_list[i], reasons[i])
                   for i in range(min(cfg.save_rollouts, len(rewards)))]
        return StepResult(m, samples)

    def _advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """This rank's advantages, computed over every rank's rewards (so ``scale_rewards=batch`` divides by the
        whole step's standard deviation, as one process holding all the samples would)."""
        acc, cfg = self.accelerator, self.cfg
        parts = gather_object([rewards.tolist()])  # one list per rank, in rank order (one process: its own)
        every = torch.tensor([v for part in parts for v in part], dtype=rewards.dtype)
        start = sum(len(part) for part in parts[:acc.process_index])
        adv = compute_advantages(cfg.advantage, every, cfg.num_generations, cfg.scale_rewards)
        return adv[start:start + len(rewards)]

    def _filter(self, rewards: torch.Tensor):
        band = tuple(self.cfg.accuracy_band) if self.cfg.accuracy_band else None
        return group_filter(rewards, self.cfg.num_generations, drop_zero_variance=self.cfg.drop_zero_variance,
                            accuracy_band=band)

    def _check_rewards(self, rounds: list[_Round]) -> dict[str, float]:
        """The step's reward failures as metrics (``reward_errors``, ``reward_nonfinite``: samples scored 0), a
        warning when there are any, and the stop after ``max_reward_failure_steps`` steps in a row in which the
        reward failed on every sample of every rank (the ranks decide together)."""
        cfg, n = self.cfg, sum(len(x.rewards) for x in rounds)
        failed, nonfinite = sum(x.reward_failed for x in rounds), sum(x.reward_nonfinite for x in rounds)
        name = self.train_task.reward_name
        if nonfinite:
            logger.warning("step %d: reward %r gave NaN/inf/None for %d of %d samples (scored 0)", self.step_idx + 1,
                           name, nonfinite, n)
        all_failed = not skip_together(self.accelerator, failed < n)
        self.reward_failed_steps = self.reward_failed_steps + 1 if all_failed else 0
        if cfg.max_reward_failure_steps and self.reward_failed_steps >= cfg.max_reward_failure_steps:
            error = next((x.reward_error for x in reversed(rounds) if x.reward_error), "on another rank")
            raise RewardError(f"stopping at step {self.step_idx + 1}: reward {name!r} failed on every sample for "
                              f"{self.reward_failed_steps} steps in a row (max_reward_failure_steps="
                              f"{cfg.max_reward_failure_steps}; last error: {error}); fix the reward")
        return {"reward_errors": float(failed), "reward_nonfinite": float(nonfinite)}

    def _count_skipped(self, any_kept: bool, filt) -> None:
        """Count the steps in a row without an update because no group had reward signal; warn at each, stop
        at ``max_skipped_steps`` saying why (a run that never updates would otherwise end as a success)."""
        cfg = self.cfg
        self.skipped_steps = 0 if any_kept else self.skipped_steps + 1
        if any_kept:
            return
        groups = len(filt.keep) // cfg.num_generations
        why = f"{filt.zero_variance_groups} of {groups} groups had all-equal rewards"
        if filt.out_of_band_groups:
            why += f", {filt.out_of_band_groups} were outside accuracy_band"
        limit = f"the run stops at {cfg.max_skipped_steps}" if cfg.max_skipped_steps else "max_skipped_steps=0"
        logger.warning("step %d: no update, no group had reward signal (%s); %d step(s) in a row (%s)",
                       self.step_idx + 1, why, self.skipped_steps, limit)
        if cfg.max_skipped_steps and self.skipped_steps >= cfg.max_skipped_steps:
            hint = ("rollout.temperature=0 decodes every sample of a prompt alike: raise it" if cfg.rollout.temperature
                    == 0 else "check the rollouts (rollouts.jsonl) for a reward that does not vary or a policy "
                    f"collapsed by too large a learning rate (optim.lr={cfg.optim.lr:g})")
            raise TrainingStopped(f"stopping at step {self.step_idx + 1}: {self.skipped_steps} steps in a row were "
                                  f"skipped, no group had reward signal ({why}); {hint}, or set max_skipped_steps=0 "
                                  "to go on")

    def _check_weights(self) -> None:
        """Stop, naming the step, when the update left a NaN / inf weight in the policy or the value model (one
        reduction per step, agreed over the ranks: :func:`~dllm_rl.training.finite.nonfinite_weights`)."""
        value = self.value.module if self.value is not None else None
        bad = nonfinite_weights(self.accelerator, {"policy": self.model.model, "value model": value})
        if not bad:
            return
        lrs = {"policy": f"optim.lr={self.cfg.optim.lr:g}",
               "value model": f"value_model.lr={getattr(self.value, 'lr', 0.0):g}"}
        raise TrainingStopped(f"stopping at step {self.step_idx + 1}: the update left NaN/inf weights in the "
                              f"{' and the '.join(bad)} ({', '.join(lrs[b] for b in bad)}); final/ is not written. "
                              "Lower the learning rate and start again, or resume from an earlier checkpoint")

    def _rollout_round(self, policy: DiffusionLM, idx: list[int], first_sample: int) -> _Round:
        """Roll out (with ``policy``'s weights) and reward this rank's share of the prompts ``idx`` (every
        rank's, drawn together: rank ``r`` takes ``idx[r::world]``). The round's samples are numbered over all
        ranks from ``first_sample`` on, in the order of ``idx``; a sample's rollout and mask seeds come from its
        number, so they do not depend on the world size (one process with ``world x prompts_per_step`` prompts
        draws what the ranks draw together)."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        rank, world = acc.process_index, acc.num_processes
        examples = [self.train_task[i] for i in idx[rank::world]]
        texts, ids = encode_prompts(self.train_task, examples, self.tokenizer)
        G = cfg.num_generations
        group_ids = [p for p in ids for _ in range(G)]
        # sample j of this rank belongs to prompt idx[rank + world * (j // G)]; the 0 keeps one process's seeds
        # those of earlier versions (which put the rank there)
        seeds = [derive_seed(cfg.seed, self.step_idx, 0, first_sample + (rank + world * (j // G)) * G + j % G)
                 for j in range(len(group_ids))]
        self.model.eval()  # rollouts: eval mode, no grad, in-memory weights
        with torch.no_grad(), self._gathered(policy):
            rollout = generate_batched(policy, group_ids, decode_config(cfg, policy), seeds=seeds,
                                       tokenizer=self.tokenizer, batch_size=cfg.rollout.batch_size)
        self.model.train()
        t_rollout = time.perf_counter() - t0
        prompts_rep = [t for t in texts for _ in range(G)]
        columns: dict[str, list] = {}
        for k in sorted({k for ex in examples for k in ex} - {"prompt"}):
            columns[k] = [ex.get(k) for ex in examples for _ in range(G)]
        scored = safe_scores(self.train_task.reward_fn, prompts_rep, rollout.texts, columns, **self._reward_options())
        rewards, steps = scored.totals, scored.steps
        view = RoundView(group_ids, prompts_rep, rollout, list(rewards), scored.reasons, seeds, columns, G)
        if self.rollout_hook is not None:  # the one call site of rollout hooks (dllm_rl.rl.hooks)
            view = self.rollout_hook(view, self._hook_context(policy, view, [ex for ex in examples for _ in range(G)]))
            steps = steps_after_hook(steps, rollout, rewards, view.rollout, view.rewards)
        return _Round(view.rollout, view.rewards, view.reasons, seeds, prompts_rep,
                      t_rollout, time.perf_counter() - t0 - t_rollout, dict(view.stats), steps,
                      scored.failed, scored.nonfinite, scored.error)

    def _reward_options(self) -> dict:
        """How the trainer calls the reward: its name in messages and the time one call may take."""
        return {"name": self.train_task.reward_name, "timeout_s": self.cfg.reward_timeout_s}

    def _hook_context(self, policy: DiffusionLM, view: RoundView, examples: list[dict]) -> HookContext:
        """What a rollout hook may call for this round (see :class:`dllm_rl.rl.hooks.HookContext`)."""
        cfg = self.cfg

        def generate(indices: list[int], prefill: list[dict[int, int]]) -> Rollout:
            seeds = [derive_seed(view.seeds[i], HOOK_ROLLOUTS) for i in indices]
            self.model.eval()
            with torch.no_grad():
                out = generate_batched(policy, [view.prompt_ids[i] for i in indices], decode_config(cfg, policy),
                                       seeds=seeds, tokenizer=self.tokenizer, batch_size=cfg.rollout.batch_size,
                                       prefill=prefill)
            self.model.train()
            return out

        def reward(indices: list[int], rollout: Rollout) -> tuple[list[float], list[str]]:
            cols = {k: [v[i] for i in indices] for k, v in view.columns.items()}
            return safe_rewards(self.train_task.reward_fn, [view.prompts[i] for i in indices], rollout.texts, cols,
                                **self._reward_options())

        return HookContext(generate=generate, reward=reward,
                           reference=lambda i: self.train_task.reference_completion(examples[i]),
                           tokenizer=self.tokenizer, eos_token_id=self.model.eos_token_id,
                           gen_length=cfg.rollout.gen_length, step=self.step_idx)

    def _scorer_options(self, **defaults) -> dict:
        """The estimator's options (``estimator_options``) with the LM-head chunk (``logprob_chunk_size``)."""
        return {"logprob_chunk_size": self.chunk_size, **defaults, **(self.cfg.estimator_options or {})}

    def _scores(self, model, batch: ScoringBatch, gen_seed: int, **defaults) -> TokenScores:
        """``model``'s scores of ``batch`` (masks from ``gen_seed``); under FSDP2 / ZeRO-3 every rank runs as many
        forwards (``agree_calls``: every rank scores each micro-batch, padding included)."""
        gen = torch.Generator(device="cpu").manual_seed(gen_seed)
        return estimate(model, self.cfg.estimator, batch, gen, agree_calls=forward_agreement(self.accelerator),
                        **self._scorer_options(**defaults))

    def _batch(self, rollout: Rollout, keep: torch.Tensor, mask_seeds: list[int]) -> ScoringBatch:
        """The kept samples of ``rollout`` on the policy's device, with their estimator mask seeds, laid out at the
        training block (``train_block_size``; block models)."""
        device = self.model.device
        full = ScoringBatch.from_rollout(rollout)
        full.sample_seeds = torch.tensor([s % (1 << 62) for s in mask_seeds], dtype=torch.long)
        batch = full.select(keep)
        return ScoringBatch(*(None if t is None else t.to(device) for t in (
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, batch.step_map,
            batch.completion_valid)), sample_seeds=batch.sample_seeds, block_size=self.train_block)

    def _update(self, rollout, keep: torch.Tensor, adv: torch.Tensor, mask_seeds: list[int]) -> dict:
        cfg, acc = self.cfg, self.accelerator
        # A rank that kept fewer samples pads with micro-batches, up to the most any rank has, that re-score one
        # of its samples at weight 0: every rank then runs the same forwards, backwards and collectives (DDP's
        # all-reduces, FSDP2 / ZeRO-3's parameter gathers, the scorer's agreement) whatever the data.
        mbs = micro_batches(acc, len(keep), cfg.micro_batch_size)
        padding = [not mb for mb in mbs]
        accum = cfg.gradient_accumulation_steps or len(mbs)
        # each optimizer step's loss is the mean over the samples every rank kept for it, whatever the world
        # size: a micro-batch weighs len(mb) * world / (samples of its step over all ranks), since the gradient
        # all-reduce averages over the ranks
        step_n = sum_over_ranks(acc, [sum(len(mb) for mb in mbs[k:k + accum]) for k in range(0, len(mbs), accum)])
        if any(padding):
            keep = torch.cat([keep, keep[:1] if len(keep) else torch.zeros(1, dtype=torch.long)])
            mbs = [mb or [len(keep) - 1] for mb in mbs]
        batch = self._batch(rollout, keep, mask_seeds)
        adv_k = adv[keep].to(self.model.device)
        est_seed = derive_seed(cfg.seed, self.step_idx, ESTIMATOR_MASKS)
        max_len = batch.completion_len
        # Old log-probs: needed whenever the weights can move before a micro-batch is scored again.
        need_old = cfg.num_iterations > 1 or accum < len(mbs)
        policy_scored = need_old or (cfg.beta > 0 and self.reference is None)
        with torch.no_grad(), self._gathered(self.model if policy_scored else None), \
                self._gathered(self.reference if cfg.beta > 0 else None):
            old = [self._scores(self.model, batch.select(mb), est_seed) for mb in mbs] if need_old else None
            ref = None
            if cfg.beta > 0:
                if self.reference is not None:
                    ref = [self._scores(self.reference, batch.select(mb), est_seed) for mb in mbs]
                else:  # LoRA: the base weights are the reference
                    with acc.unwrap_model(self.model.model).disable_adapter():
                        ref = [self._scores(self.model, batch.select(mb), est_seed) for mb in mbs]
        loss_fn = POLICY_LOSSES[cfg.loss_type]
        loss_cfg = LossConfig.from_rl_config(cfg, max_length=max_len)
        self.grad_norms = []
        stats: dict[str, list[float]] = {}
        losses = []
        first_dev = 0.0
        for it in range(cfg.num_iterations):
            for j, mb in enumerate(mbs):
                sub = batch.select(mb)
                last_in_group = (j + 1) % accum == 0 or j == len(mbs) - 1
                ctx = micro_step(acc, self.model.model, last_in_group)
                scale = 0.0 if padding[j] else len(mb) * acc.num_processes / step_n[j // accum]
                with ctx:
                    out, new = self._micro_loss(loss_fn, sub, est_seed, old[j] if old is not None else None,
                                                ref[j] if ref is not None else None, adv_k[mb], loss_cfg, scale)
                    if not bool(torch.isfinite(out.loss)):  # on every rank alike (see _micro_loss)
                        self._bad_update(out.loss)
                    elif not padding[j]:  # a padding micro-batch has weight 0: no statistics
                        losses.append(float(out.loss.detach()))
                        for k, v in out.stats.items():
                            stats.setdefault(k, []).append(v)
                        if it == 0 and j < accum:  # before the first optimizer step: CRN make this 0
                            first_dev = max(first_dev, out.stats.get("ratio_max_dev", 0.0))
                        scored = new.weight != 0
                        if scored.any():
                            stats.setdefault("neg_logp", []).append(float(-new.logp.detach()[scored].mean()))
                if last_in_group:
                    self._optimizer_step()
        result = {k: sum(v) / len(v) for k, v in stats.items() if k != "ratio_max_dev"}
        result["ratio_dev_first_update"] = first_dev
        if self.grad_norms:
            result["grad_norm"] = max(self.grad_norms)
        result["loss"] = sum(losses) / len(losses) if losses else float("nan")
        result["bad_updates"] = float(self.bad_updates)
        return result

    def _micro_loss(self, loss_fn, sub: ScoringBatch, est_seed: int, old: TokenScores | None,
                    ref: TokenScores | None, adv: torch.Tensor, loss_cfg: LossConfig, scale: float):
        """Score ``sub``, compute the loss and back-propagate ``scale`` times it when it is finite on every rank
        (else no rank back-propagates it, and the returned loss is NaN on every rank); a loss that is linear in
        the draws (BGPO) is back-propagated draw by draw (:mod:`dllm_rl.rl.draw_backward`)."""
        cfg = self.cfg
        if getattr(loss_fn, "linear_in_draws", False):
            if old is None:  # one draw's rows per model call, so this pass is flat in the draws too
                with torch.no_grad():
                    old = self._scores(self.model, sub, est_seed, max_rows=sub.batch_size)
            return backward_by_draw(self.model, cfg.estimator, sub, est_seed, self._scorer_options(), loss_fn, old,
                                    ref, adv, loss_cfg, scale, self._backward, forward_agreement(self.accelerator),
                                    self._all_finite)
        new = self._scores(self.model, sub, est_seed)
        out = loss_fn(new, old if old is not None else _detached(new), ref, adv, sub.lengths, loss_cfg)
        if not self._all_finite(out.loss):
            return replace(out, loss=torch.full_like(out.loss.detach(), math.nan)), new
        self._backward(out.loss * scale)
        return out, new

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """Whether ``loss`` is finite on every rank (a collective: every rank asks for each micro-batch), so
        that the ranks back-propagate, skip and count bad updates alike."""
        return not skip_together(self.accelerator, not bool(torch.isfinite(loss)))

    def _backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Back-propagate ``loss`` (``last=False``: a part of a micro-batch's loss with more to come); a step
        already marked to be skipped never reaches DeepSpeed's boundary, where the engine would step."""
        boundary = last and not getattr(self, "_skip_next", False)
        backward(self.accelerator, self.model.model, loss, boundary=boundary)

    def _bad_update(self, loss: torch.Tensor) -> None:
        self.bad_updates += 1
        discard_gradients(self.accelerator, self.model.model, self.optimizer)
        self._skip_next = True
        logger.warning("step %d: non-finite loss (%s); update skipped (%d/%d)", self.step_idx, float(loss.detach()),
                       self.bad_updates, self.cfg.max_bad_steps)
        if self.bad_updates >= self.cfg.max_bad_steps:
            raise TrainingStopped(f"stopping at step {self.step_idx + 1}: {self.bad_updates} updates had a NaN/inf "
                                  f"loss (max_bad_steps={self.cfg.max_bad_steps}); lower optim.lr or check the rewards")

    def _optimizer_step(self) -> None:
        if skip_together(self.accelerator, getattr(self, "_skip_next", False)):  # one rank skips: all do
            self._skip_next = False
            discard_gradients(self.accelerator, self.model.model, self.optimizer)
            return
        if self.cfg.optim.max_grad_norm:  # the norm before clipping
            self.grad_norms.append(clip_gradients(self.accelerator, self.model.model, self.cfg.optim.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ----------------------------------------------------------------------------- evaluation
    def averaged(self, live: bool = False):
        """A context in which the policy holds the returned weights: the weight average when ``ema_decay``
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
                                   batch_size=cfg.rollout.batch_size, seed=cfg.seed)
        if world > 1:
            vals = mean_over_ranks(self.accelerator, {"accuracy": res.accuracy * res.n, "reward": res.reward * res.n,
                                                      "n": float(res.n)})
            total = vals["n"] * world
            if total > 0:  # (every rank's shard is empty only if the task is, which the constructor refuses)
                res = replace(res, accuracy=vals["accuracy"] * world / total,
                              reward=vals["reward"] * world / total, n=int(round(total)))
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


def _detached(s: TokenScores) -> TokenScores:
    return replace(s, logp=s.logp.detach())
