"""The DPO trainer: the SFT trainer (:class:`~dllm_rl.sft.trainer.SFTTrainer`: accelerate, checkpoints, exact
resume, LoRA, FSDP2 / ZeRO, progress, logs) with VRPO's pairs, reference and loss in its seams.

Per micro-batch of ``train.micro_batch_size`` pairs: one :class:`~dllm_rl.estimators.ScoringBatch` of the chosen
then the rejected responses, each with its own mask seed (from the pair's position in the run's pair stream, so chosen
and rejected are masked independently, and a resumed run draws the masks of an uninterrupted one); the ``vrpo``
estimator scores it under the policy and, with the same generator, under the reference: the same masked inputs
(VRPO's antithetic sampling). The reference is the start weights: a frozen copy (sharded like the policy), or with
LoRA the base model with the adapters off (no copy); it is rebuilt from ``model.path`` on resume, never saved.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from dllm_rl.dpo.config import DPO_APPLICABLE, DPOConfig
from dllm_rl.dpo.data import load_pairs
from dllm_rl.dpo.loss import dpo_loss
from dllm_rl.estimators import ScoringBatch, estimate
from dllm_rl.seeding import derive_seed
from dllm_rl.sft.data import DataReport, collate, encode_images
from dllm_rl.sft.trainer import SFTResult, SFTTrainer
from dllm_rl.training.backend import shard_reference
from dllm_rl.training.ranks import forward_agreement
from dllm_rl.training.run_dir import interrupted
from dllm_rl.training.sharding import gathered_parameters

REJECTED_STREAM = 1  # derive_seed(seed, pair position, REJECTED_STREAM): the rejected response's mask seed


class DPOTrainer(SFTTrainer):
    """Set-up and loop of one ``dllm-rl dpo`` run; :func:`train` is ``DPOTrainer(cfg).run()``."""

    name = "dpo"
    applicable = DPO_APPLICABLE
    trains_vision = False  # the reference scores the policy's image features: they must stay the start weights'

    def objective_settings(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"num_mc": cfg.num_mc, "max_rows": cfg.max_rows, "logprob_chunk_size": cfg.logprob_chunk_size}

    def load_examples(self) -> tuple[list[Any], DataReport]:
        return load_pairs(self.cfg.data, self.tokenizer, self.dlm.eos_token_id,
                          verbose=self.verbose and self.accelerator.is_main_process)

    def before_prepare(self) -> None:
        """The reference: a frozen copy of the start weights, unless LoRA's base weights serve."""
        self.reference = None
        if not self.cfg.lora.enabled:
            self.reference = copy.deepcopy(self.dlm).eval().requires_grad_(False)

    def after_prepare(self) -> None:
        if self.reference is not None:
            shard_reference(self.accelerator, self.reference)

    def next_micro_batch(self) -> tuple[list[Any], ScoringBatch]:
        """This rank's share of the next global micro-batch of pairs: the chosen responses, then the rejected."""
        first = self.stream.consumed
        idx = self.stream.take(self.global_micro)
        bs, rank, seed = self.cfg.train.micro_batch_size, self.accelerator.process_index, self.cfg.run.seed
        mine = [self.examples[i] for i in idx[rank * bs : (rank + 1) * bs]]
        rows, images = encode_images([p.chosen for p in mine] + [p.rejected for p in mine], self.prompts, self.dlm)
        batch = collate(rows, self.dlm.pad_token_id, images)
        positions = [first + rank * bs + i for i in range(len(mine))]
        seeds = [derive_seed(seed, n) for n in positions] + [derive_seed(seed, n, REJECTED_STREAM) for n in positions]
        batch.sample_seeds = torch.tensor([s % (1 << 62) for s in seeds], dtype=torch.long)
        return mine, batch

    def _reference_context(self):
        """Where the reference scores: the copy's full parameters (a no-op unless sharded), or the adapters off."""
        if self.reference is not None:
            return gathered_parameters(self.accelerator, self.reference.model)
        return self.dlm.model.disable_adapter()

    def micro_loss(self, batch: ScoringBatch) -> tuple[torch.Tensor, int, dict[str, float]]:
        """VRPO's loss on one micro-batch: policy and reference ELBOs over the same masked rows."""
        opts, agree = self.objective_options, forward_agreement(self.accelerator)
        scores = estimate(self.model, "vrpo", batch, self.mask_generator(), agree_calls=agree, **opts)
        with torch.no_grad(), self._reference_context(), self.accelerator.autocast():
            ref_model = self.reference if self.reference is not None else self.model
            ref = estimate(ref_model, "vrpo", batch, self.mask_generator(),
                           agree_calls=agree if self.reference is None else None, **opts)
        b = batch.batch_size // 2
        policy, reference = scores.sequence_score(), ref.sequence_score().to(scores.logp.device)
        out = dpo_loss(policy[:b], policy[b:], reference[:b], reference[b:], self.cfg.beta, self.cfg.elbo_divisor)
        return out.loss, int(scores.scored().sum().item()), out.metrics()


def train(cfg: DPOConfig, verbose: bool = True) -> SFTResult:
    """Run VRPO preference training as configured (see :class:`DPOConfig`)."""
    return run(DPOTrainer(cfg, verbose=verbose))


def run(trainer: DPOTrainer) -> SFTResult:
    """The run of a built trainer (what :func:`train` and ``dllm_rl.DPOTrainer.train`` do); the trainer is closed after
    it."""
    try:  # the run directory's lock is released however the run ends
        return trainer.run()
    except KeyboardInterrupt:
        raise interrupted(trainer.out, trainer.step, trainer.max_steps, "run.resume=latest",
                          "run.overwrite=true") from None
    finally:
        trainer.close()


__all__ = ["DPOTrainer", "run", "train"]
