"""The RL update stage: the micro-batch engine of one step's optimisation passes (:class:`PolicyUpdater`).

It takes what the collect stage (:mod:`dllm_rl.rl.collect`) hands over, the step's rollouts, their advantages and
which samples train, and runs ``train.num_iterations`` passes of micro-batches over them: old and reference scores,
the policy loss, backward, gradient accumulation, clipping and the optimiser step.

The rank bookkeeping lives here and only here: every rank must take each branch alike, so a rank that kept
fewer samples pads with micro-batches that re-score one of its samples at weight 0 (the same forwards,
backwards and collectives on every rank whatever the data: DDP's all-reduces, FSDP2 / ZeRO-3's parameter
gathers, the scorer's agreement), losses are normalised over all ranks, and a non-finite loss is agreed by
every rank before any backward.

Randomness: the step's estimator generator is ``derive_seed(seed, step, ESTIMATOR_MASKS)``; each sample's masks
come from its own mask seed, shared by the old, reference and current policy (common random numbers: at the
first pass every ratio is exactly 1; metric ``ratio_dev_first_update``, absent for a ``ratio_free`` loss).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from dllm_rl.estimators import ScoringBatch, TokenScores, estimate
from dllm_rl.estimators.trajectory import backward_by_steps
from dllm_rl.models import DiffusionLM
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.draw_backward import backward_by_draw, loss_gradient
from dllm_rl.rl.inpaint_filter import inpaint_loss_mask
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig, PolicyLoss, policy_objective
from dllm_rl.sampling import Rollout
from dllm_rl.seeding import ESTIMATOR_MASKS, derive_seed
from dllm_rl.training.backend import backward, clip_gradients, discard_gradients, micro_step
from dllm_rl.training.finite import TrainingStopped
from dllm_rl.training.ranks import forward_agreement, max_over_ranks, micro_batches, skip_together, sum_over_ranks

logger = logging.getLogger(__name__)


class PolicyUpdater:
    """Runs the optimisation passes of RL steps over the (prepared) policy with its optimiser and schedule.

    ``gathered(dlm)`` is the trainer's context for full parameters of the policy or the reference (FSDP2 /
    ZeRO-3); ``train_block`` the training layout's block (block models; TraceRL's block-size adaptation).
    ``bad_updates`` counts updates skipped for a non-finite loss over the run (kept in checkpoints);
    ``grad_norms`` the pre-clipping gradient norms of the current step."""

    def __init__(self, cfg: RLConfig, accelerator: Any, model: DiffusionLM, reference: DiffusionLM | None,
                 optimizer: Any, scheduler: Any, train_block: int | None, gathered: Callable[[Any], Any]):
        self.cfg, self.accelerator = cfg, accelerator
        self.model, self.reference = model, reference
        self.optimizer, self.scheduler = optimizer, scheduler
        self.train_block = train_block
        self.gathered = gathered
        self.chunk_size = cfg.model.logprob_chunk_size
        self.bad_updates = 0
        self.grad_norms: list[float] = []
        self.step_idx = 0
        self._skip_next = False

    def scorer_options(self, **defaults) -> dict:
        """The estimator's options (``estimator_options``) with the LM-head chunk (``model.logprob_chunk_size``)."""
        return {"logprob_chunk_size": self.chunk_size, **defaults, **(self.cfg.estimator_options or {})}

    def scores(self, model, batch: ScoringBatch, gen_seed: int, entropy: bool = False, **defaults) -> TokenScores:
        """``model``'s scores of ``batch`` (masks from ``gen_seed``; ``entropy``: the predictive entropies of the
        scored tokens instead); under FSDP2 / ZeRO-3 every rank runs as many forwards (``agree_calls``: every
        rank scores each micro-batch, padding included)."""
        gen = torch.Generator(device="cpu").manual_seed(gen_seed)
        return estimate(model, self.cfg.estimator, batch, gen, agree_calls=forward_agreement(self.accelerator),
                        entropy=entropy, **self.scorer_options(**defaults))

    def inpaint_filter(self, batch: ScoringBatch, inpainted: torch.Tensor, mbs: list[list[int]], est_seed: int,
                       result: dict) -> None:
        """IGPO's entropy filter (:mod:`dllm_rl.rl.inpaint_filter`, ``inpaint_entropy_keep``): set
        ``batch.loss_mask`` to drop the low-entropy inpainted tokens (``inpainted`` ``[N, G]``, per sample of
        ``batch``), ranked under the current (old) policy and the masks the update scores with; metrics
        ``inpaint_tokens`` / ``inpaint_trained``. Every rank scores when any has inpainted tokens."""
        if self.cfg.inpaint_entropy_keep is None or not max_over_ranks(self.accelerator, int(bool(inpainted.any()))):
            return
        mask = torch.ones_like(batch.completion_mask)
        total = trained = 0
        with torch.no_grad(), self.gathered(self.model):
            for mb in mbs:
                ent = self.scores(self.model, batch.select(mb), est_seed, entropy=True)
                keep, n, k = inpaint_loss_mask(ent, inpainted[mb], self.cfg.inpaint_entropy_keep)
                mask[mb] = keep.to(mask.device)
                total, trained = total + n, trained + k
        batch.loss_mask = mask
        result.update(inpaint_tokens=float(total), inpaint_trained=float(trained))

    def batch(self, rollout: Rollout, keep: torch.Tensor, mask_seeds: list[int]) -> ScoringBatch:
        """The kept samples of ``rollout`` on the policy's device, with their estimator mask seeds and image features
        (the rollout's, reused: the old, reference and current policy score the images they were sampled with),
        laid out at the training block (``train.block_size``; block models)."""
        device = self.model.device
        full = ScoringBatch.from_rollout(rollout)
        full.sample_seeds = torch.tensor([s % (1 << 62) for s in mask_seeds], dtype=torch.long)
        batch = full.select(keep)
        return ScoringBatch(*(None if t is None else t.to(device) for t in (
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, batch.step_map,
            batch.completion_valid)), sample_seeds=batch.sample_seeds, block_size=self.train_block,
            images=batch.images.to(device) if batch.images is not None else None,
            confidence=batch.confidence.to(device) if batch.confidence is not None else None,
            entropy=batch.entropy.to(device) if batch.entropy is not None else None,
            uniform=batch.uniform.to(device) if batch.uniform is not None else None)

    def run(self, rollout, keep: torch.Tensor, adv: torch.Tensor, mask_seeds: list[int], step_idx: int) -> dict:
        """``train.num_iterations`` optimisation passes over the kept samples ``keep`` of ``rollout`` (advantages
        ``adv``, estimator mask seeds ``mask_seeds``) at step ``step_idx``; returns the update's metrics."""
        cfg, acc = self.cfg, self.accelerator
        self.step_idx = step_idx
        # A rank that kept fewer samples pads with micro-batches, up to the most any rank has, that re-score one
        # of its samples at weight 0: every rank then runs the same forwards, backwards and collectives (DDP's
        # all-reduces, FSDP2 / ZeRO-3's parameter gathers, the scorer's agreement) whatever the data.
        mbs = micro_batches(acc, len(keep), cfg.train.micro_batch_size)
        padding = [not mb for mb in mbs]
        accum = cfg.train.gradient_accumulation_steps or len(mbs)
        # each optimizer step's loss is the mean over the samples every rank kept for it, whatever the world
        # size: a micro-batch weighs len(mb) * world / (samples of its step over all ranks), since the gradient
        # all-reduce averages over the ranks
        step_n = sum_over_ranks(acc, [sum(len(mb) for mb in mbs[k:k + accum]) for k in range(0, len(mbs), accum)])
        if any(padding):
            keep = torch.cat([keep, keep[:1] if len(keep) else torch.zeros(1, dtype=torch.long)])
            mbs = [mb or [len(keep) - 1] for mb in mbs]
        batch = self.batch(rollout, keep, mask_seeds)
        adv_k = adv[keep].to(self.model.device)
        est_seed = derive_seed(cfg.run.seed, self.step_idx, ESTIMATOR_MASKS)
        filtered: dict[str, float] = {}
        if cfg.inpaint_entropy_keep is not None:
            inpainted = (rollout.prefilled if rollout.prefilled is not None
                         else torch.zeros_like(rollout.completion_mask))[keep.to(rollout.completion_mask.device)]
            self.inpaint_filter(batch, inpainted.to(self.model.device), mbs, est_seed, filtered)
        max_len = batch.completion_len
        # Old log-probs: needed whenever the weights can move before a micro-batch is scored again.
        need_old = cfg.train.num_iterations > 1 or accum < len(mbs)
        policy_scored = need_old or (cfg.beta > 0 and self.reference is None)
        with torch.no_grad(), self.gathered(self.model if policy_scored else None), \
                self.gathered(self.reference if cfg.beta > 0 else None):
            old = [self.scores(self.model, batch.select(mb), est_seed) for mb in mbs] if need_old else None
            ref = None
            if cfg.beta > 0:
                if self.reference is not None:
                    ref = [self.scores(self.reference, batch.select(mb), est_seed) for mb in mbs]
                else:  # LoRA: the base weights are the reference
                    with acc.unwrap_model(self.model.model).disable_adapter():
                        ref = [self.scores(self.model, batch.select(mb), est_seed) for mb in mbs]
        loss_fn = POLICY_LOSSES[cfg.loss_type]
        loss_cfg = LossConfig.from_rl_config(cfg, max_length=max_len, progress=step_idx / cfg.train.max_steps)
        self.grad_norms = []
        stats: dict[str, list[float]] = {}
        losses = []
        first_dev = 0.0
        for it in range(cfg.train.num_iterations):
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
                        if it == 0 and j < accum and not loss_fn.ratio_free:  # before the first step: CRN make
                            first_dev = max(first_dev, _ratio_dev(loss_fn, out.stats))  # this 0
                        scored = new.weight != 0
                        if scored.any():
                            stats.setdefault("neg_logp", []).append(float(-new.logp.detach()[scored].mean()))
                if last_in_group:
                    self._optimizer_step()
        result = {k: sum(v) / len(v) for k, v in stats.items() if k != "ratio_max_dev"}
        result.update(filtered)
        if not loss_fn.ratio_free:
            result["ratio_dev_first_update"] = first_dev
        if self.grad_norms:
            result["grad_norm"] = max(self.grad_norms)
        result["loss"] = sum(losses) / len(losses) if losses else float("nan")
        result["bad_updates"] = float(self.bad_updates)
        return result

    def _micro_loss(self, loss_fn, sub: ScoringBatch, est_seed: int, old: TokenScores | None,
                    ref: TokenScores | None, adv: torch.Tensor, loss_cfg: LossConfig, scale: float):
        """Score ``sub``, compute the loss and back-propagate ``scale`` times it when it is finite on every rank
        (else no rank back-propagates it, and the returned loss is NaN on every rank); a ``draw_by_draw`` loss
        (BGPO, EBPO) is back-propagated one draw at a time (:mod:`dllm_rl.rl.draw_backward`)."""
        cfg = self.cfg
        if loss_fn.draw_by_draw:
            current = None
            if old is None:  # on-policy: the old scores are the current ones (one draw's rows per model call)
                with torch.no_grad():
                    old = current = self.scores(self.model, sub, est_seed, max_rows=sub.batch_size)
            return backward_by_draw(self.model, cfg.estimator, sub, est_seed, self.scorer_options(), loss_fn, old,
                                    ref, adv, loss_cfg, scale, self._backward, forward_agreement(self.accelerator),
                                    self._all_finite, current=current)
        if cfg.train.step_chunk_size and cfg.estimator == "trajectory":
            return self._loss_by_steps(loss_fn, sub, est_seed, old, ref, adv, loss_cfg, scale)
        new = self.scores(self.model, sub, est_seed)
        out = policy_objective(loss_fn, new, old if old is not None else _detached(new), ref, adv, sub.loss_lengths,
                               loss_cfg)
        if not self._all_finite(out.loss):
            return replace(out, loss=torch.full_like(out.loss.detach(), math.nan)), new
        self._backward(out.loss * scale)
        return out, new

    def _loss_by_steps(self, loss_fn, sub: ScoringBatch, est_seed: int, old: TokenScores | None,
                       ref: TokenScores | None, adv: torch.Tensor, loss_cfg: LossConfig, scale: float):
        """The trajectory estimator's loss back-propagated ``train.step_chunk_size`` replayed steps at a time
        (:func:`~dllm_rl.estimators.trajectory.backward_by_steps`): the scores without a graph give the loss and
        its gradient in the log-probs, which each chunk's replay then carries back (the all-at-once gradient)."""
        with torch.no_grad():
            current = self.scores(self.model, sub, est_seed)
        out, grad = loss_gradient(loss_fn, current, old if old is not None else current, ref, adv, sub.loss_lengths,
                                  loss_cfg, scale, self._all_finite)
        if grad is not None:
            backward_by_steps(self.model, sub, grad, self.cfg.train.step_chunk_size, self._backward,
                              self.scorer_options()["logprob_chunk_size"])
        return out, current

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """Whether ``loss`` is finite on every rank (a collective: every rank asks for each micro-batch), so
        that the ranks back-propagate, skip and count bad updates alike."""
        return not skip_together(self.accelerator, not bool(torch.isfinite(loss)))

    def _backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Back-propagate ``loss`` (``last=False``: a part of a micro-batch's loss with more to come); a step
        already marked to be skipped never reaches DeepSpeed's boundary, where the engine would step."""
        boundary = last and not self._skip_next
        backward(self.accelerator, self.model.model, loss, boundary=boundary)

    def _bad_update(self, loss: torch.Tensor) -> None:
        self.bad_updates += 1
        discard_gradients(self.accelerator, self.model.model, self.optimizer)
        self._skip_next = True
        logger.warning("step %d: non-finite loss (%s); update skipped (%d/%d)", self.step_idx, float(loss.detach()),
                       self.bad_updates, self.cfg.train.max_bad_steps)
        if self.bad_updates >= self.cfg.train.max_bad_steps:
            raise TrainingStopped(f"stopping at step {self.step_idx + 1}: {self.bad_updates} updates had a NaN/inf "
                                  f"loss (train.max_bad_steps={self.cfg.train.max_bad_steps}); lower the learning rate "
                                  f"(optim.lr={self.cfg.optim.lr:g}) or check the rewards")

    def _optimizer_step(self) -> None:
        if skip_together(self.accelerator, self._skip_next):  # one rank skips: all do
            self._skip_next = False
            discard_gradients(self.accelerator, self.model.model, self.optimizer)
            return
        if self.cfg.optim.max_grad_norm:  # the norm before clipping
            self.grad_norms.append(clip_gradients(self.accelerator, self.model.model, self.cfg.optim.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def _ratio_dev(loss: PolicyLoss, stats: dict[str, float]) -> float:
    """The largest ``|ratio - 1|`` that ``loss`` (one with a ratio) reports; a loss that reports none is refused,
    so that the first-update check cannot pass for a loss that forgot it."""
    if "ratio_max_dev" not in stats:
        raise ValueError(f"policy loss {loss.name!r} has an importance ratio but reported no ratio_max_dev statistic "
                         "(register a loss without a ratio with ratio_free=True)")
    return stats["ratio_max_dev"]


def _detached(s: TokenScores) -> TokenScores:
    return replace(s, logp=s.logp.detach())
