"""``one_step``: the likelihood of one decoding step's prediction given the state before it (MDPO, arXiv 2508.13148).

A sample here is a recorded decoding state: its completion holds the step's prediction at the slots that were masked
before the step (``completion_mask``) and the state's tokens elsewhere (committed tokens, and the mask id at slots
of later blocks, which the state showed masked too). One row per sample masks exactly the counted slots and scores
each once with weight 1: ``log p(x0_t[i] | x_t)`` for every ``i`` masked in ``x_t`` (the single-step likelihood of
MDPO's loss, section 3; authors' ``_get_per_token_logps``, DARE's ``_forward_micro_batch_mdpo``). Block models
score in the two-stream layout, where the block sees the clean earlier blocks and its own state, as the block
sampler did. ``info["confidence"]`` (``[1, B, G]``, with the batch's ``confidence``) carries each slot's
sampling score to the loss. Deterministic (``D = 1``); the generator is not used.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("one_step")
def plan_one_step(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator | None = None) -> MaskedRows:
    """One row per sample with its counted slots masked and scored (MDPO's single-step likelihood, arXiv 2508.13148,
    section 3; see the module docstring)."""
    keep = batch.completion_mask.any(-1)
    sample = torch.nonzero(keep).flatten()
    masked = batch.completion_mask[sample]
    info = {"confidence": batch.confidence.float()[None]} if batch.confidence is not None else {}
    return build_rows(batch, sample, torch.zeros_like(sample), masked, masked.float(), model.mask_token_id, 1,
                      info=info, two_stream=model.is_block_causal)
