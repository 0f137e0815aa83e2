"""The RL trainer: rollout -> reward -> advantages -> ``num_iterations`` optimisation passes, in one process
per rank over the same in-memory weights (no subprocess per stage, no reload between stages).

Read top to bottom: :func:`train` sets everything up, :meth:`RLTrainer.step` is one RL step.

Randomness: every stream is derived from ``(seed, step, sample)`` — prompt order (``IndexStream``),
rollout noise (one generator per sequence) and estimator masks (one seed per sample, or per prompt group
with ``estimator_noise=group``, shared by the old, reference and current policy: common random numbers, so at
the first pass every ratio is exactly 1).
A run resumed from a checkpoint therefore replays exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from accelerate.utils import DistributedDataParallelKwargs, gather_object

from dllm_rl.config import ConfigError, save_config, to_dict
from dllm_rl.estimators import ScoringBatch, TokenScores, estimate
from dllm_rl.eval.heldout import HeldOut, check_not_empty, encode_prompts, heldout_accuracy
from dllm_rl.jsonl import append_jsonl, keep_rows_through
from dllm_rl.models import DiffusionLM, detect_family, load_model, load_tokenizer, save_model
from dllm_rl.models.loading import read_config
from dllm_rl.models.moe import freeze_routers, router_stats
from dllm_rl.rl.advantages import compute_advantages, group_filter
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig
from dllm_rl.rl.rewards import safe_rewards
from dllm_rl.rl.rollout_copy import RolloutCopy, rollout_dtype
from dllm_rl.sampling import DecodeConfig, Rollout, generate_batched
from dllm_rl.tasks import get_task
from dllm_rl.training import (
    IndexStream,
    MetricsLogger,
    Progress,
    WeightEMA,
    apply_lora,
    build_optimizer,
    build_scheduler,
    latest_checkpoint,
    load_checkpoint,
    make_accelerator,
    merged_model,
    plot_metrics,
    prune_checkpoints,
    save_checkpoint,
)
from dllm_rl.training.backend import (
    grad_norm_value,
    micro_step,
    publishable,
    refuse_unsharded_features,
    setup_backend,
    shard_reference,
)
from dllm_rl.training.checkpoint import checkpoint_name
from dllm_rl.training.run_dir import RL_RUN_FILES, open_run_dir
from dllm_rl.training.sharding import gathered_parameters

logger = logging.getLogger(__name__)
_MIX = 1_000_003  # odd multiplier for deriving seeds


def _seed(*parts: int) -> int:
    """A 63-bit seed from integers (deterministic across processes and Python runs)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def decode_config(cfg: RLConfig, model, *, evaluation: bool = False) -> DecodeConfig:
    """The sampler settings for rollouts, or (``evaluation``) for the held-out evaluation: the same window,
    order and cache, at ``eval.temperature`` and on the evaluation's own schedule."""
    r = cfg.rollout
    schedule = cfg.eval if evaluation else r
    block = model.block_size if model.is_block_causal else (r.block_length or r.gen_length)
    steps = None if schedule.threshold is not None else (schedule.steps or block)
    if r.gen_length % block:
        what = f"the model's block_size ({block})" if model.is_block_causal else f"rollout.block_length ({block})"
        raise ConfigError(f"rollout.gen_length: {r.gen_length} is not a multiple of {what}")
    return DecodeConfig(gen_length=r.gen_length, block_length=block, steps=steps, threshold=schedule.threshold,
                        confidence=r.confidence, temperature=cfg.eval.temperature if evaluation else r.temperature,
                        top_k=r.top_k, top_p=r.top_p, cache=r.cache)


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


@dataclass
class StepResult:
    metrics: dict
    samples: list[tuple[str, str, float, str]]


class RLTrainer:
    """Holds the policy, optional reference, optimiser, data stream and logger of one run."""

    def __init__(self, cfg: RLConfig, reward_fn=None):
        if not cfg.model:
            raise ConfigError("model: set the checkpoint directory (model=PATH)")
        family = detect_family(read_config(cfg.model), f"{cfg.model}/config.json")
        self.cfg = cfg = resolve(cfg, family.attention)  # every config error before anything heavy
        # DDP: no buffer broadcast before each forward (the only buffers are rotary tables, equal on every
        # rank), so ranks may run different numbers of forwards (uneven eval shards, dynamic decoding).
        # device=auto on a machine without CUDA means CPU mode: accelerate then forms gloo ranks under
        # `accelerate launch --multi_gpu` instead of starting independent one-rank runs.
        cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
        self.accelerator = make_accelerator(
            cpu=cpu, timeout_s=cfg.distributed_timeout_s,
            kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])
        setup_backend(self.accelerator, cfg.micro_batch_size, cfg.optim.max_grad_norm)
        self.out = Path(cfg.output_dir)
        self.is_main = self.accelerator.is_main_process
        # refused (a file, another run's, an old run without resume/overwrite), locked and cleaned before compute
        self.run_dir = open_run_dir(self.out, RL_RUN_FILES, resume=bool(cfg.resume), overwrite=cfg.overwrite) \
            if self.is_main else None
        self.accelerator.wait_for_everyone()
        try:
            self._build(reward_fn)
        except BaseException:
            self.close()
            raise

    def _build(self, reward_fn) -> None:
        cfg = self.cfg
        self.model = load_model(cfg.model, dtype=cfg.dtype, device=self.accelerator.device,
                                tokenizer_dir=cfg.tokenizer)
        self.tokenizer = load_tokenizer(cfg.tokenizer or cfg.model, mask_token_id=self.model.mask_token_id)
        for evaluation in (False, True):  # the sampler's settings need the model: checked before any forward
            decode_config(cfg, self.model, evaluation=evaluation)
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
        self.reference = None
        if cfg.beta > 0 and cfg.reference == "copy":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        if cfg.freeze_router:
            freeze_routers(self.model.model)
        self.model.train()
        self.optimizer = build_optimizer(self.model.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.total_optimizer_steps())
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
        self.stream = IndexStream(len(self.train_task), seed=cfg.seed)
        self.step_idx = 0
        self.bad_updates = 0
        self.grad_norms: list[float] = []  # pre-clipping gradient norms of the current step
        self.accuracy_before: float | None = None  # held-out accuracy at step 0 (kept in checkpoints)
        if cfg.resume:
            self._resume(cfg.resume)
        self.metrics = MetricsLogger(self.out / "metrics.jsonl", resume_step=self.step_idx, enabled=self.is_main)
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
        for _ in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            # every rank draws each round's prompts, so the ranks' prompt streams stay in step
            idx = self.stream.take(cfg.prompts_per_step * self.accelerator.num_processes)
            if signal < target:
                rnd = self._rollout_round(policy, idx, first_sample=sum(len(x.rewards) for x in rounds))
                rounds.append(rnd)
                t_rollout, t_reward = t_rollout + rnd.t_rollout, t_reward + rnd.t_reward
                signal += int(self._filter(torch.tensor(rnd.rewards)).keep.view(-1, G)[:, 0].sum())
            if not cfg.dynamic_sampling or self._max_over_ranks(int(signal < target)) == 0:
                break
        rollout = Rollout.cat([x.rollout for x in rounds]) if len(rounds) > 1 else rounds[0].rollout
        rewards_list = [v for x in rounds for v in x.rewards]
        rewards = torch.tensor(rewards_list, dtype=torch.float32)
        seeds = [s for x in rounds for s in x.seeds]
        prompts_rep = [p for x in rounds for p in x.prompts]
        reasons = [why for x in rounds for why in x.reasons]

        # 4. advantages; groups with no signal are dropped (and counted), and with dynamic_sampling the groups
        # with signal beyond `target` (the last round's surplus)
        adv = compute_advantages(cfg.advantage, rewards, G, cfg.scale_rewards)
        filt = self._filter(rewards)
        keep_group = filt.keep.view(-1, G)[:, 0]
        surplus = 0
        if cfg.dynamic_sampling:
            within = keep_group & (keep_group.long().cumsum(0) <= target)
            surplus, keep_group = int((keep_group & ~within).sum()), within
        keep = torch.nonzero(keep_group.repeat_interleave(G)).flatten()

        # 5. optimisation passes over the kept samples
        # skipped only when no rank kept a sample (a rank with none still joins the others' all-reduces)
        any_kept = self._max_over_ranks(len(keep)) > 0
        # the estimator's masks: one random stream per sample, or per prompt group (shared by its G samples)
        mask_seeds = seeds if cfg.estimator_noise == "sample" else [seeds[j - j % G] for j in range(len(seeds))]
        t_update = time.perf_counter()
        update = self._update(rollout, keep, adv, mask_seeds) if any_kept else {"skipped_step": 1.0}
        if self.ema is not None:
            self.ema.update()
        t_update = time.perf_counter() - t_update

        lengths = rollout.completion_mask.sum(-1).float()
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
        m.update(update)
        if self.model.family.moe:  # router load and entropy over the rollouts' real tokens
            dev = self.accelerator.device
            m.update(router_stats(self._plain(), torch.cat([rollout.prompt_ids, rollout.completion_ids], 1).to(dev),
                                  torch.cat([rollout.prompt_mask, rollout.completion_mask], 1).to(dev)))
        m = self._reduce(m)
        samples = [(prompts_rep[i], rollout.texts[i], rewards_list[i], reasons[i])
                   for i in range(min(cfg.save_rollouts, len(rewards)))]
        return StepResult(m, samples)

    def _filter(self, rewards: torch.Tensor):
        band = tuple(self.cfg.accuracy_band) if self.cfg.accuracy_band else None
        return group_filter(rewards, self.cfg.num_generations, drop_zero_variance=self.cfg.drop_zero_variance,
                            accuracy_band=band)

    def _rollout_round(self, policy: DiffusionLM, idx: list[int], first_sample: int) -> _Round:
        """Roll out (with ``policy``'s weights) and reward this rank's share of the prompts ``idx`` (every
        rank's, drawn together); its samples are numbered from ``first_sample`` on in the step (their rollout
        and mask seeds)."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        examples = [self.train_task[i] for i in idx[acc.process_index::acc.num_processes]]
        texts, ids = encode_prompts(self.train_task, examples, self.tokenizer)
        G = cfg.num_generations
        group_ids = [p for p in ids for _ in range(G)]
        seeds = [_seed(cfg.seed, self.step_idx, acc.process_index, first_sample + j) for j in range(len(group_ids))]
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
        rewards, reasons = safe_rewards(self.train_task.reward_fn, prompts_rep, rollout.texts, columns)
        return _Round(rollout, rewards, reasons, seeds, prompts_rep,
                      t_rollout, time.perf_counter() - t0 - t_rollout)

    def _scores(self, model, batch: ScoringBatch, gen_seed: int) -> TokenScores:
        gen = torch.Generator(device="cpu").manual_seed(gen_seed)
        return estimate(model, self.cfg.estimator, batch, gen, **(self.cfg.estimator_options or {}))

    def _update(self, rollout, keep: torch.Tensor, adv: torch.Tensor, mask_seeds: list[int]) -> dict:
        cfg, acc = self.cfg, self.accelerator
        device = self.model.device
        full = ScoringBatch.from_rollout(rollout)
        full.sample_seeds = torch.tensor([s % (1 << 62) for s in mask_seeds], dtype=torch.long)
        batch = full.select(keep)
        batch = ScoringBatch(*(None if t is None else t.to(device) for t in (
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, batch.step_map,
            batch.completion_valid)), sample_seeds=batch.sample_seeds)
        adv_k = adv[keep].to(device)
        n = len(keep)
        mbs = [list(range(i, min(i + cfg.micro_batch_size, n))) for i in range(0, n, cfg.micro_batch_size)]
        # DDP: every rank runs as many backward passes (so as many gradient all-reduces); a rank that kept
        # fewer samples pads with empty micro-batches, which back-propagate a zero loss.
        mbs += [[] for _ in range(self._max_over_ranks(len(mbs)) - len(mbs))]
        accum = cfg.gradient_accumulation_steps or len(mbs)
        est_seed = _seed(cfg.seed, self.step_idx, 7919)
        max_len = batch.completion_len
        # Old log-probs: needed whenever the weights can move before a micro-batch is scored again.
        need_old = cfg.num_iterations > 1 or accum < len(mbs)
        policy_scored = need_old or (cfg.beta > 0 and self.reference is None)
        with torch.no_grad(), self._gathered(self.model if policy_scored else None), \
                self._gathered(self.reference if cfg.beta > 0 else None):
            old = [self._scores(self.model, batch.select(mb), est_seed) if mb else None for mb in mbs] \
                if need_old else None
            ref = None
            if cfg.beta > 0:
                if self.reference is not None:
                    ref = [self._scores(self.reference, batch.select(mb), est_seed) if mb else None
                           for mb in mbs]
                else:  # LoRA: the base weights are the reference
                    with acc.unwrap_model(self.model.model).disable_adapter():
                        ref = [self._scores(self.model, batch.select(mb), est_seed) if mb else None
                               for mb in mbs]
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
                if not mb:  # padding (see above)
                    with ctx:
                        acc.backward(self._zero_loss())
                    if last_in_group:
                        self._optimizer_step()
                    continue
                with ctx:
                    new = self._scores(self.model, sub, est_seed)
                    old_j = old[j] if old is not None else _detached(new)
                    out = loss_fn(new, old_j, ref[j] if ref is not None else None, adv_k[mb], sub.lengths, loss_cfg)
                    group_size = min(accum, len(mbs) - (j // accum) * accum)
                    group_n = sum(len(mbs[k]) for k in range(j - j % accum, j - j % accum + group_size))
                    loss = out.loss * (len(mb) / group_n)
                    finite = bool(torch.isfinite(loss))
                    if finite:
                        acc.backward(loss)
                        losses.append(float(out.loss.detach()))
                        for k, v in out.stats.items():
                            stats.setdefault(k, []).append(v)
                        if it == 0 and j < accum:  # before the first optimizer step: CRN make this 0
                            first_dev = max(first_dev, out.stats["ratio_max_dev"])
                        scored = new.weight != 0
                        if scored.any():
                            stats.setdefault("neg_logp", []).append(float(-new.logp.detach()[scored].mean()))
                    else:
                        self._bad_update(loss)
                        if acc.num_processes > 1:  # still join the other ranks' all-reduce
                            acc.backward(self._zero_loss())
                if last_in_group:
                    self._optimizer_step()
        result = {k: sum(v) / len(v) for k, v in stats.items() if k != "ratio_max_dev"}
        result["ratio_dev_first_update"] = first_dev
        if self.grad_norms:
            result["grad_norm"] = max(self.grad_norms)
        result["loss"] = sum(losses) / len(losses) if losses else float("nan")
        result["bad_updates"] = float(self.bad_updates)
        return result

    def _bad_update(self, loss: torch.Tensor) -> None:
        self.bad_updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._skip_next = True
        logger.warning("step %d: non-finite loss (%s); update skipped (%d/%d)", self.step_idx, float(loss.detach()),
                       self.bad_updates, self.cfg.max_bad_steps)
        if self.bad_updates >= self.cfg.max_bad_steps:
            raise RuntimeError(f"stopping: {self.bad_updates} updates had a NaN/inf loss (max_bad_steps="
                               f"{self.cfg.max_bad_steps}); lower optim.lr or check the rewards")

    def _zero_loss(self) -> torch.Tensor:
        """A zero loss through the whole (DDP) module: a rank with nothing to train joins the all-reduce."""
        ids = torch.full((1, 1), self.model.mask_token_id, dtype=torch.long, device=self.model.device)
        return self.model(ids).logits.float().sum() * 0.0

    def _max_over_ranks(self, value: int) -> int:
        """The largest ``value`` over all ranks (for decisions every rank must take alike)."""
        if self.accelerator.num_processes == 1:
            return value
        t = torch.tensor([value], dtype=torch.long, device=self.accelerator.device)
        return int(self.accelerator.gather(t).max())

    def _optimizer_step(self) -> None:
        # one rank skips: all do (the weights stay equal)
        if self._max_over_ranks(int(getattr(self, "_skip_next", False))):
            self._skip_next = False
            self.optimizer.zero_grad(set_to_none=True)
            return
        if self.cfg.optim.max_grad_norm:
            norm = self.accelerator.clip_grad_norm_(self.model.model.parameters(), self.cfg.optim.max_grad_norm)
            self.grad_norms.append(grad_norm_value(norm))  # before clipping
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _reduce(self, m: dict) -> dict:
        """Each metric averaged over the ranks that report a finite value (a rank that kept no sample has
        no loss statistics)."""
        if self.accelerator.num_processes == 1:
            return m
        rows = gather_object([m])
        out = {}
        for k in sorted({k for r in rows for k in r}):
            vals = [float(r[k]) for r in rows if k in r and math.isfinite(r[k])]
            out[k] = sum(vals) / len(vals) if vals else float("nan")
        return out

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
        with self.averaged(live), torch.no_grad(), self._gathered(self.model):
            res = heldout_accuracy(self.model, self.tokenizer, self.eval_task, mine,
                                   decode_config(cfg, self.model, evaluation=True),
                                   batch_size=cfg.rollout.batch_size, seed=cfg.seed)
        if world > 1:
            vals = self._reduce({"accuracy": res.accuracy * res.n, "reward": res.reward * res.n, "n": float(res.n)})
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

    # ----------------------------------------------------------------------------- checkpoints
    def _plain(self) -> DiffusionLM:
        """The policy over its HF module unwrapped from DDP (weights load/save and peft helpers need it)."""
        inner = self.accelerator.unwrap_model(self.model.model)
        if inner is self.model.model:
            return self.model
        return DiffusionLM(inner, self.model.family, self.model.published_config)

    def save(self, final: bool = False) -> Path | None:
        self.accelerator.wait_for_everyone()
        path = self.out / "checkpoints" / checkpoint_name(self.step_idx)
        save_checkpoint(path, self._plain(), optimizer=self.optimizer, scheduler=self.scheduler,
                        step=self.step_idx, data_state=self.stream.state_dict(), tokenizer=self.tokenizer,
                        config=to_dict(self.cfg),
                        extra={"bad_updates": self.bad_updates, "accuracy_before": self.accuracy_before},
                        accelerator=self.accelerator, ema=self.ema, prepared=self.model.model)
        if self.is_main:
            prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        return path

    def _resume(self, where: str) -> None:
        path = latest_checkpoint(self.out) if where == "latest" else Path(where)
        if path is None:
            raise FileNotFoundError(f"resume=latest but {self.out / 'checkpoints'} holds no checkpoint")
        state = load_checkpoint(path, self._plain(), optimizer=self.optimizer, scheduler=self.scheduler,
                                accelerator=self.accelerator, ema=self.ema)
        self.step_idx = state.step
        self.stream.load_state_dict(state.data_state)
        self.bad_updates = int((state.extra or {}).get("bad_updates", 0))
        self.accuracy_before = (state.extra or {}).get("accuracy_before")
        if self.is_main:  # drop what a run killed after this checkpoint wrote
            keep_rows_through(self.out / "rollouts.jsonl", self.step_idx)
            print(f"resumed from {path} at step {self.step_idx}")

    def close(self) -> None:
        """Release the run directory (its lock) for another run."""
        if self.run_dir is not None:
            self.run_dir.close()

    def save_final_model(self) -> Path:
        """``final/``: the returned weights (the average when ``ema_decay`` is on), LoRA merged."""
        path = self.out / "final"
        with self.averaged():
            plain = publishable(self.accelerator, self.model.model, self._plain())  # collective when sharded
            if self.is_main:
                unwrapped = merged_model(plain) if self.cfg.lora.enabled else plain
                save_model(unwrapped, path, tokenizer=self.tokenizer)
        return path


def _detached(s: TokenScores) -> TokenScores:
    return replace(s, logp=s.logp.detach())


def _evaluate_after(trainer: RLTrainer, summary: dict, say) -> None:
    """The held-out evaluation after training: of the returned weights, and of the live policy when they are
    the weight average."""
    cfg = trainer.cfg
    after = trainer.evaluate()
    trainer.metrics.log(trainer.step_idx, eval_accuracy=after.accuracy, eval_reward=after.reward)
    summary["accuracy_after"] = after.accuracy
    say(f"held-out accuracy after: {after.accuracy:.3f} ({after.n} items)"
        + (f", weight average (ema_decay={cfg.ema_decay})" if trainer.ema is not None else ""))
    if trainer.ema is not None:  # what the average bought: the last live policy on the same items
        live = trainer.evaluate(live=True)
        summary["accuracy_after_live"] = live.accuracy
        trainer.metrics.log(trainer.step_idx, eval_accuracy_live=live.accuracy)
        say(f"held-out accuracy after, live policy: {live.accuracy:.3f}")


def train(cfg: RLConfig, reward_fn=None) -> dict:
    """Run RL as configured; returns a summary (held-out accuracy before and after, minutes, paths).

    ``reward_fn`` (optional) is a TRL-signature reward ``(prompts, completions, **columns) -> list[float]``
    that replaces the task's built-in reward.
    """
    trainer = RLTrainer(cfg, reward_fn=reward_fn)
    cfg = trainer.cfg
    t_start = time.perf_counter()
    say = print if trainer.is_main else (lambda *a, **k: None)
    say(f"dllm-rl rl: {cfg.algorithm} ({cfg.estimator}, {cfg.loss_type} loss, {cfg.advantage}) on "
        f"{trainer.model.family.name} [{trainer.model.num_parameters():,} params], task {cfg.task}: "
        f"{len(trainer.train_task)} train / "
        + (f"{len(trainer.eval_task)} held-out" if trainer.eval_task is not None else "no held-out (eval.limit=0)"))
    summary: dict = {"algorithm": cfg.algorithm, "model": cfg.model, "start_step": trainer.step_idx,
                     "is_main": trainer.is_main}
    if trainer.rollout_note:
        say(trainer.rollout_note)
    if trainer.step_idx == 0 and trainer.eval_task is not None:
        before = trainer.evaluate()
        trainer.accuracy_before = before.accuracy
        trainer.metrics.log(0, eval_accuracy=before.accuracy, eval_reward=before.reward)
        say(f"held-out accuracy before: {before.accuracy:.3f} ({before.n} items)")
    if trainer.accuracy_before is not None:  # a resumed run: from its checkpoint
        summary["accuracy_before"] = trainer.accuracy_before
    if cfg.rollout.compile and trainer.step_idx < cfg.max_steps:
        say("rollout.compile: the first step compiles the rollout model (torch.compile, once; 10-30 s on a CPU)")
    bar = Progress(cfg.max_steps, initial=trainer.step_idx, desc=f"rl/{cfg.algorithm}",
                   disable=not (cfg.progress and trainer.is_main))
    while trainer.step_idx < cfg.max_steps:
        if cfg.max_time_minutes and (time.perf_counter() - t_start) / 60 > cfg.max_time_minutes:
            say(f"time budget of {cfg.max_time_minutes} min reached at step {trainer.step_idx}")
            break
        res = trainer.step()
        trainer.step_idx += 1
        m = res.metrics
        if (cfg.eval.every and trainer.eval_task is not None and trainer.step_idx % cfg.eval.every == 0
                and trainer.step_idx < cfg.max_steps):
            ev = trainer.evaluate()
            m.update(eval_accuracy=ev.accuracy, eval_reward=ev.reward)
        trainer.metrics.log(trainer.step_idx, **m)
        bar.update(1, tokens=int(m["completion_length"] * m["kept_samples"]), reward=f"{m['reward']:.3f}",
                   loss=f"{m.get('loss', float('nan')):.4f}")
        if trainer.is_main and res.samples:
            append_jsonl(trainer.out / "rollouts.jsonl", [
                {"step": trainer.step_idx, "prompt": p, "completion": c, "reward": r, "reason": why}
                for p, c, r, why in res.samples])
        if cfg.log_samples_every and trainer.step_idx % cfg.log_samples_every == 0:
            for prompt, completion, reward, reason in res.samples[:2]:
                bar.write(f"  [{reward:.2f}] {prompt.strip()[-60:]!r} -> {completion!r} ({reason})")
        if cfg.save_every and trainer.step_idx % cfg.save_every == 0:
            trainer.save()
    bar.close()
    summary.update(steps=trainer.step_idx, minutes=(time.perf_counter() - t_start) / 60,
                   output_dir=str(trainer.out))
    if trainer.eval_task is not None:
        _evaluate_after(trainer, summary, say)
    trainer.save()
    summary["final_model"] = str(trainer.save_final_model())
    if trainer.is_main:
        summary["plots"] = [str(p) for p in plot_metrics(trainer.out)]
        (trainer.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    trainer.close()
    return summary
