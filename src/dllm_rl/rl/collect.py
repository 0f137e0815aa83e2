"""The RL collect stage: prompts -> rollouts -> rewards -> advantages, handed on as a :class:`StepBatch`.

:meth:`RolloutCollector.collect` draws the step's prompts (every rank draws each round's prompts, so the ranks'
prompt streams stay in step), rolls them out with the policy's in-memory weights (or its rollout copy), rewards
them, runs the rollout hook, repeats rounds under ``dynamic_sampling`` until enough groups carry signal, and
computes the advantages and which samples train. The update stage (:mod:`dllm_rl.rl.update`) takes it from there.

Randomness: a sample's rollout noise and estimator masks come from ``derive_seed(seed, step, 0, sample)``, its
number over all ranks, so they do not depend on the world size; a rollout hook's regeneration of a sample from
``derive_seed(sample_seed, HOOK_ROLLOUTS)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object

from dllm_rl.models import DiffusionLM
from dllm_rl.models.image_inputs import PromptEncoder, repeat_rows
from dllm_rl.rewards.safe import RewardError, safe_rewards, safe_scores
from dllm_rl.rl.advantages import ADVANTAGES, compute_advantages, decoupled_advantages, group_filter
from dllm_rl.rl.config import RLConfig, decode_config, rollout_engine
from dllm_rl.rl.hooks import HookContext, RolloutHook, RoundView, TrainingRows, samples_per_prompt
from dllm_rl.rl.value import steps_after_hook
from dllm_rl.sampling import Rollout, generate_batched
from dllm_rl.sampling.canvas import span
from dllm_rl.sampling.inputs import decode_block_length
from dllm_rl.seeding import HOOK_ROLLOUTS, derive_seed
from dllm_rl.training.ranks import max_over_ranks, skip_together

logger = logging.getLogger(__name__)


@dataclass
class Round:
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
    training: TrainingRows | None = None  # the rows the update trains on instead (a rollout hook's, e.g. MDPO's)
    advantages: list[float] | torch.Tensor | None = None  # the rollout hook's: per sample (trees), [n, L] (EGSPO)
    policy_rewards: list[float] | None = None  # with a rollout hook: the rewards of the policy's own samples
    terms: list[dict[str, float] | None] | None = None  # per sample: a combined reward's raw term values


@dataclass
class StepBatch:
    """What the collect stage hands to the update stage: this rank's samples of one step (``N`` of them, every
    round's concatenated) and what trains. ``advantages`` ``[N]`` are the sequence advantages (``[N, L]`` when a
    rollout hook made token advantages; the value model replaces them with its token advantages); ``keep`` the
    indices of the samples that train (groups with signal, within ``train.prompts_per_step``); ``mask_seeds`` each
    sample's estimator mask seed (its own, or its group's)."""

    rollout: Rollout
    rewards: torch.Tensor
    reward_values: list[float]  # the same, as the reward gave them
    policy_rewards: list[float] | None  # with a rollout hook: the rewards before it replaced samples (else None)
    seeds: list[int]
    prompts: list[str]
    reasons: list[str]
    step_scores: list[list[float] | None]
    advantages: torch.Tensor
    keep: torch.Tensor
    mask_seeds: list[int]
    filt: Any  # the group filter's result: keep, zero_variance_groups, out_of_band_groups
    rounds: int
    surplus: int
    hook_stats: dict[str, float]
    reward_health: dict[str, float]
    t_rollout: float
    t_reward: float
    training: TrainingRows | None = None  # every round's training rows, sources numbered over the step's samples
    rejected: int = 0  # samples of the kept groups that a selecting advantage rule (RAFT's) gave 0: not trained

    def trained(self) -> tuple[Rollout, torch.Tensor, torch.Tensor, list[int]]:
        """``(rollout, keep, advantages, mask_seeds)`` the update trains on: the kept samples, or every training row
        when a rollout hook made them (each with its source sample's mask seed)."""
        t = self.training
        if t is None:
            return self.rollout, self.keep, self.advantages, self.mask_seeds
        return t.rollout, torch.arange(len(t.rollout)), t.advantages, [self.mask_seeds[i] for i in t.source]


def _training_rows(rounds: list[Round]) -> TrainingRows | None:
    """The rounds' training rows in one, their sources counted over all the rounds' samples (None: no hook made
    any)."""
    if all(x.training is None for x in rounds):
        return None
    if any(x.training is None for x in rounds):
        raise ValueError("the rollout hook made training rows in some rounds only; it must make them in every round")
    offsets = [sum(len(x.rewards) for x in rounds[:k]) for k in range(len(rounds))]
    return TrainingRows(Rollout.cat([x.training.rollout for x in rounds]),
                        torch.cat([x.training.advantages for x in rounds]),
                        [i + off for x, off in zip(rounds, offsets) for i in x.training.source])


def rollout_columns(rollout: Rollout) -> dict[str, list[list[int]]]:
    """The columns a reward receives from the rollout, per completion over its answer (``completion_mask``):
    ``completion_ids`` (its token ids, as TRL passes them) and ``step_map`` (the decoding step that committed each,
    -1 for a prefilled one); and per completion its forward passes ``nfe`` and tokens per forward ``tpf`` (a speed
    term's inputs, :mod:`dllm_rl.rewards.speed`). A judge in process mode chunks the answer by them and places chunk
    scores on its decoding steps, the steps the value model puts process rewards on."""
    lengths = rollout.completion_mask.sum(1).tolist()
    return {"completion_ids": [row[:n].tolist() for row, n in zip(rollout.completion_ids, lengths)],
            "step_map": [row[:n].tolist() for row, n in zip(rollout.step_map, lengths)],
            "nfe": rollout.nfe.tolist(), "tpf": rollout.tokens_per_forward().tolist()}


class RolloutCollector:
    """Collects one RL step's samples on this rank (see the module docstring). ``gathered(dlm)`` is the
    trainer's context for full parameters of a sharded policy (FSDP2 / ZeRO-3); ``model`` the policy, put in
    eval mode around its rollouts. ``reward_failed_steps`` counts the steps in a row whose reward failed on every
    sample. ``prompts`` (default: one for ``cfg.model.path``) turns prompts with images into ids and features
    (:mod:`dllm_rl.models.image_inputs`): a group's image is encoded once, by the policy that rolls it out.
    ``reward`` (default: the task's) scores the rollouts; one with ``metrics()`` (a
    :class:`~dllm_rl.rewards.reward_terms.CombinedReward`) adds them to the step's metrics."""

    def __init__(self, cfg: RLConfig, accelerator: Any, model: DiffusionLM, tokenizer: Any, train_task: Any,
                 rollout_hook: RolloutHook | None, stream: Any, gathered: Callable[[Any], Any],
                 prompts: PromptEncoder | None = None,
                 reward: Callable[..., Any] | None = None):
        self.cfg, self.accelerator = cfg, accelerator
        self.reward_fn = reward if reward is not None else train_task.reward_fn
        self.reward_name = getattr(reward, "__name__", None) or train_task.reward_name
        self.prompts = prompts if prompts is not None else PromptEncoder(tokenizer, cfg.model.path)
        self.model, self.tokenizer = model, tokenizer
        self.train_task, self.rollout_hook, self.stream = train_task, rollout_hook, stream
        self.gathered = gathered
        self.step_idx = 0
        self.reward_failed_steps = 0
        self.curriculum: Any = None  # a Curriculum with pass_rate_band: drawn prompts out of the band are skipped
        self.skipped_prompts = 0
        self.thresholds: Any = None  # a ThresholdLearner with rollout.decoding=learned (dllm_rl.rl.learned_threshold)

    @property
    def group_size(self) -> int:
        """Samples per prompt: ``rollout.num_generations``, or a tree's non-root nodes (:func:`samples_per_prompt`)."""
        return samples_per_prompt(self.rollout_hook, self.cfg.rollout.num_generations)

    def collect(self, policy: DiffusionLM, step_idx: int) -> StepBatch:
        """Step ``step_idx``'s samples, rolled out with ``policy``'s weights: one round, or (``dynamic_sampling``)
        rounds until ``train.prompts_per_step`` groups have signal; then advantages, and which samples train (groups
        with no signal are dropped, and with ``dynamic_sampling`` the groups with signal beyond the target)."""
        cfg = self.cfg
        self.step_idx = step_idx
        G, target = self.group_size, cfg.train.prompts_per_step
        rounds: list[Round] = []
        signal, self.skipped_prompts = 0, 0
        if self.thresholds is not None:
            self.thresholds.reset()
        for r in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            # every rank draws each round's prompts, so the ranks' prompt streams stay in step
            idx = self.draw(cfg.train.prompts_per_step * self.accelerator.num_processes)
            if signal < target:
                rnd = self.round(policy, idx, first_sample=r * len(idx) * G)
                rounds.append(rnd)
                self.record_pass_rates(idx, rnd.rewards)
                signal += int(self.filter(torch.tensor(rnd.rewards), rnd.rollout).keep.view(-1, G)[:, 0].sum())
            if not cfg.dynamic_sampling or max_over_ranks(self.accelerator, int(signal < target)) == 0:
                break
        rollout = Rollout.cat([x.rollout for x in rounds]) if len(rounds) > 1 else rounds[0].rollout
        reward_values = [v for x in rounds for v in x.rewards]
        rewards = torch.tensor(reward_values, dtype=torch.float32)
        seeds = [s for x in rounds for s in x.seeds]
        reward_health = self.check_rewards(rounds)
        filt = self.filter(rewards, rollout)
        keep_group = filt.keep.view(-1, G)[:, 0]
        surplus = 0
        if cfg.dynamic_sampling:
            within = keep_group & (keep_group.long().cumsum(0) <= target)
            surplus, keep_group = int((keep_group & ~within).sum()), within
        # the estimator's masks: one random stream per sample, or per prompt group (shared by its G samples)
        mask_seeds = seeds if cfg.estimator_noise == "sample" else [seeds[j - j % G] for j in range(len(seeds))]
        advantages = self.advantages(rewards, rounds)
        keep = torch.nonzero(keep_group.repeat_interleave(G)).flatten()
        in_groups = len(keep)
        if (getattr(ADVANTAGES.get(cfg.advantage), "selects", False) and advantages.dim() == 1
                and not cfg.value_model.enabled):  # (the value model's advantages replace the rule's, on whole groups)
            keep = keep[advantages[keep] != 0]  # a selecting rule's (RAFT's) rejected samples leave the update
        return StepBatch(
            rollout=rollout, rewards=rewards, reward_values=reward_values, seeds=seeds,
            policy_rewards=None if self.rollout_hook is None else [v for x in rounds for v in x.policy_rewards],
            prompts=[p for x in rounds for p in x.prompts],
            reasons=[why for x in rounds for why in x.reasons],
            step_scores=[s for x in rounds for s in (x.step_scores or [None] * len(x.rewards))],
            advantages=advantages, keep=keep,
            mask_seeds=mask_seeds, filt=filt, rounds=len(rounds), surplus=surplus,
            hook_stats={k: sum(x.stats.get(k, 0.0) for x in rounds) for k in sorted({k for x in rounds
                                                                                      for k in x.stats})},
            reward_health=reward_health, t_rollout=sum(x.t_rollout for x in rounds),
            t_reward=sum(x.t_reward for x in rounds), training=_training_rows(rounds), rejected=in_groups - len(keep))

    def draw(self, k: int) -> list[int]:
        """The next ``k`` prompts of the stream; with online difficulty filtering (``curriculum.pass_rate_band``)
        the drawn prompts whose last pass rate lies outside the band are skipped (``skipped_prompts``), at most one
        pass over the data per draw, after which skipped ones fill the draw."""
        cur = self.curriculum
        if cur is None or cur.cfg.pass_rate_band is None:
            return self.stream.take(k)
        kept, skipped = [], []
        while len(kept) < k and len(skipped) < self.stream.n:
            (i,) = self.stream.take(1)
            (kept if cur.keeps(i) else skipped).append(i)
        self.skipped_prompts += len(skipped)
        return kept + skipped[:k - len(kept)]

    def record_pass_rates(self, idx: list[int], rewards: list[float]) -> None:
        """Every rank's prompts' pass rates of this round, recorded on every rank (their tables stay equal)."""
        if self.curriculum is None or self.curriculum.cfg.pass_rate_band is None:
            return
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        for mine, values in gather_object([(idx[rank::world], list(rewards))]):
            self.curriculum.record(mine, values, self.group_size)

    def advantages(self, rewards: torch.Tensor, rounds: list[Round] | None = None) -> torch.Tensor:
        """This rank's advantages, computed over every rank's rewards (so ``scale_rewards=batch`` divides by the
        whole step's standard deviation, as one process holding all the samples would); or those the rollout hook
        computed (tree rollouts: per sibling group, within a prompt; EGSPO's stepwise returns: ``[N, L]``, one per
        completion token)."""
        acc, cfg = self.accelerator, self.cfg
        if rounds and all(x.advantages is not None for x in rounds):
            return torch.cat([torch.as_tensor(x.advantages, dtype=torch.float32) for x in rounds])
        decoupled = cfg.reward.normalization == "decoupled" and rounds
        mine = self.term_matrix(rounds) if decoupled else rewards.tolist()
        parts = gather_object([mine])  # one list per rank, in rank order (one process: its own)
        every = torch.tensor([v for part in parts for v in part], dtype=rewards.dtype)
        start = sum(len(part) for part in parts[:acc.process_index])
        if decoupled:  # LightningRL's per-term normalisation (rewards/speed.py)
            adv = decoupled_advantages(cfg.advantage, every, [t.weight for t in self.reward_fn.terms],
                                       self.group_size, cfg.scale_rewards, cfg.advantage_options)
        else:
            adv = compute_advantages(cfg.advantage, every, self.group_size, cfg.scale_rewards,
                                     cfg.advantage_options)
        return adv[start:start + len(rewards)]

    def term_matrix(self, rounds: list[Round]) -> list[list[float]]:
        """Per sample, each reward term's raw value in the order of ``reward.terms`` (0 where its reward failed)."""
        names = [t.name for t in self.reward_fn.terms]
        every = [terms for x in rounds for terms in (x.terms or [None] * len(x.rewards))]
        return [[(terms or {}).get(n, 0.0) for n in names] for terms in every]

    def filter(self, rewards: torch.Tensor, rollout: Rollout | None = None):
        """Which groups carry signal (:func:`~dllm_rl.rl.advantages.group_filter`), with ``tpf_spread`` over the
        tokens per forward of ``rollout``'s samples."""
        cfg = self.cfg
        band = tuple(cfg.accuracy_band) if cfg.accuracy_band else None
        tpf = rollout.tokens_per_forward() if rollout is not None and cfg.tpf_spread is not None else None
        return group_filter(rewards, self.group_size, drop_zero_variance=cfg.drop_zero_variance,
                            accuracy_band=band, tpf=tpf, tpf_spread=cfg.tpf_spread)

    def check_rewards(self, rounds: list[Round]) -> dict[str, float]:
        """The step's reward failures as metrics (``reward_errors``, ``reward_nonfinite``: samples scored 0), a
        warning when there are any, and the stop after ``reward.max_failure_steps`` steps in a row in which the
        reward failed on every sample of every rank (the ranks decide together)."""
        cfg, n = self.cfg, sum(len(x.rewards) for x in rounds)
        failed, nonfinite = sum(x.reward_failed for x in rounds), sum(x.reward_nonfinite for x in rounds)
        name = self.reward_name
        if nonfinite:
            logger.warning("step %d: reward %r gave NaN/inf/None for %d of %d samples (scored 0)", self.step_idx + 1,
                           name, nonfinite, n)
        all_failed = not skip_together(self.accelerator, failed < n)
        self.reward_failed_steps = self.reward_failed_steps + 1 if all_failed else 0
        if cfg.reward.max_failure_steps and self.reward_failed_steps >= cfg.reward.max_failure_steps:
            error = next((x.reward_error for x in reversed(rounds) if x.reward_error), "on another rank")
            raise RewardError(f"stopping at step {self.step_idx + 1}: reward {name!r} failed on every sample for "
                              f"{self.reward_failed_steps} steps in a row (reward.max_failure_steps="
                              f"{cfg.reward.max_failure_steps}; last error: {error}); fix the reward")
        health = {"reward_errors": float(failed), "reward_nonfinite": float(nonfinite)}
        health.update(self.reward_fn.metrics() if hasattr(self.reward_fn, "metrics") else {})
        if self.curriculum is not None and self.curriculum.cfg.pass_rate_band is not None:
            health["skipped_prompts"] = float(self.skipped_prompts)
        return health

    def round(self, policy: DiffusionLM, idx: list[int], first_sample: int) -> Round:
        """Roll out (with ``policy``'s weights) and reward this rank's share of the prompts ``idx`` (every
        rank's, drawn together: rank ``r`` takes ``idx[r::world]``). The round's samples are numbered over all
        ranks from ``first_sample`` on, in the order of ``idx``; a sample's rollout and mask seeds come from its
        number, so they do not depend on the world size (one process with ``world x train.prompts_per_step`` prompts
        draws what the ranks draw together)."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        rank, world = acc.process_index, acc.num_processes
        examples = [self.train_task[i] for i in idx[rank::world]]
        G = self.group_size
        # sample j of this rank belongs to prompt idx[rank + world * (j // G)]; the 0 keeps one process's seeds
        # those of earlier versions (which put the rank there)
        seeds = [derive_seed(cfg.run.seed, self.step_idx, 0, first_sample + (rank + world * (j // G)) * G + j % G)
                 for j in range(len(examples) * G)]
        self.model.eval()  # rollouts: eval mode, no grad, in-memory weights
        with torch.no_grad(), self.gathered(policy):
            # each prompt (and its image) encoded once, then repeated for its group
            texts, ids, images = self.prompts.task_prompts(policy, self.train_task, examples)
            group_ids, group_images = repeat_rows(ids, images, G)
            hook = self.rollout_hook
            replaces = hook is not None and hook.replaces_round  # the hook decodes the round (a tree)
            learned = (None if replaces or self.thresholds is None
                       else self.thresholds.draw(policy, ids, seeds, G))  # DiFFPO: a threshold per sample
            rollout = None if replaces else generate_batched(
                policy, group_ids, decode_config(cfg, policy), seeds=seeds, tokenizer=self.tokenizer,
                batch_size=cfg.rollout.batch_size, images=group_images, engine=rollout_engine(cfg),
                record_steps=hook.records_steps if hook is not None else None, thresholds=learned)
        self.model.train()
        t_rollout = time.perf_counter() - t0
        prompts_rep = [t for t in texts for _ in range(G)]
        columns: dict[str, list] = {}
        for k in sorted({k for ex in examples for k in ex} - {"prompt"}):
            columns[k] = [ex.get(k) for ex in examples for _ in range(G)]
        if rollout is None:
            view = RoundView(group_ids, prompts_rep, None, [], [], seeds, columns, G)
            view = self.rollout_hook(view, self._hook_context(policy, view, [ex for ex in examples for _ in range(G)],
                                                              group_images))
            return Round(view.rollout, view.rewards, view.reasons, seeds, prompts_rep,
                         time.perf_counter() - t0, 0.0, dict(view.stats), advantages=view.advantages,
                         policy_rewards=list(view.rewards))  # the tree's samples are all the policy's own
        columns.update(rollout_columns(rollout))
        scored = safe_scores(self.reward_fn, prompts_rep, rollout.texts, columns, **self._reward_options())
        rewards, steps = scored.totals, scored.steps
        view = RoundView(group_ids, prompts_rep, rollout, list(rewards), scored.reasons, seeds, columns, G)
        if self.rollout_hook is not None:  # the one call site of rollout hooks (dllm_rl.rl.hooks)
            view = self.rollout_hook(view, self._hook_context(policy, view, [ex for ex in examples for _ in range(G)]))
            steps = steps_after_hook(steps, rollout, rewards, view.rollout, view.rewards)
        return Round(view.rollout, view.rewards, view.reasons, seeds, prompts_rep,
                      t_rollout, time.perf_counter() - t0 - t_rollout, dict(view.stats), steps,
                      scored.failed, scored.nonfinite, scored.error, view.training,
                      policy_rewards=list(rewards), terms=scored.terms)

    def _reward_options(self) -> dict:
        """How the trainer calls the reward: its name in messages and the time one call may take."""
        return {"name": self.reward_name, "timeout_s": self.cfg.reward.timeout_s}

    def _hook_context(self, policy: DiffusionLM, view: RoundView, examples: list[dict],
                      images: Any = None) -> HookContext:
        """What a rollout hook may call for this round (see :class:`dllm_rl.rl.hooks.HookContext`); ``images``: the
        samples' image features when the hook decodes the round itself (``view.rollout`` is None)."""
        cfg = self.cfg
        config = decode_config(cfg, policy)
        block = decode_block_length(policy, config)
        source = view.rollout.images if view.rollout is not None else images

        def generate(indices: list[int], prefill: list[dict[int, int]], until_block: list[int] | None = None
                     ) -> Rollout:
            seeds = [derive_seed(view.seeds[i], HOOK_ROLLOUTS) for i in indices]
            self.model.eval()
            with torch.no_grad():
                out = generate_batched(policy, [view.prompt_ids[i] for i in indices], config,
                                       seeds=seeds, tokenizer=self.tokenizer, batch_size=cfg.rollout.batch_size,
                                       prefill=prefill, images=source.select(indices) if source is not None else None,
                                       engine=rollout_engine(cfg), until_block=until_block)
            self.model.train()
            return out

        def span_of(i: int) -> tuple[int, int]:
            tail, blocks = span(len(view.prompt_ids[i]), cfg.rollout.gen_length, block, policy.is_block_causal)
            return blocks, blocks * block - tail

        def reward(indices: list[int], rollout: Rollout) -> tuple[list[float], list[str]]:
            cols = {k: [v[i] for i in indices] for k, v in view.columns.items()}
            cols.update(rollout_columns(rollout))  # the regenerated samples' own ids and steps
            return safe_rewards(self.reward_fn, [view.prompts[i] for i in indices], rollout.texts, cols,
                                **self._reward_options())

        return HookContext(generate=generate, reward=reward,
                           reference=lambda i: self.train_task.reference_completion(examples[i]),
                           tokenizer=self.tokenizer, eos_token_id=self.model.eos_token_id,
                           eos_token_ids=self.model.eos_token_ids,
                           gen_length=cfg.rollout.gen_length, step=self.step_idx, span=span_of,
                           mask_token_id=policy.mask_token_id, advantage=cfg.advantage,
                           scale_rewards=cfg.scale_rewards, advantage_options=cfg.advantage_options)
