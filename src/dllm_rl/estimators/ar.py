"""``ar``: the autoregressive next-token log-likelihood under a causal mask.

For full-attention models adapted from AR models (Dream and DiffuCoder start from Qwen2.5; DiffuCoder,
Gong et al. 2025, arXiv 2506.20639): ``log p(y) = sum_i log p(y_i | prompt, y_{<i})`` (the chain rule of an
AR model), read in one causal forward per sample.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.registry import register
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("ar")
def plan_ar(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator | None = None) -> MaskedRows:
    """Next-token log-likelihood ``sum_i log p(y_i | prompt, y_{<i})`` under a causal mask: one clean row per
    sample, weight 1 on every counted completion token (deterministic: the generator is not used).

    The token at column ``c`` is predicted by the raw logits at ``c-1``: for a shifted family (Dream) that
    is the adapter's aligned ``logits[:, c]``, otherwise ``logits[:, c-1]``. A response token whose previous
    column is padding (empty prompt) is not scored. Full-attention models only.
    """
    if model.is_block_causal:
        raise ValueError("the ar estimator is for full-attention models (block models train with block/trace)")
    valid = batch.valid()
    b_n, p, g_n = batch.batch_size, batch.prompt_len, batch.completion_len
    dev = batch.completion_ids.device
    cols = torch.arange(p, p + g_n, device=dev)
    prev_valid = valid[:, (cols - 1).clamp(min=0)] & (cols >= 1)
    return MaskedRows(
        input_ids=batch.input_ids(), valid=valid, draw=torch.zeros(b_n, dtype=torch.long, device=dev),
        sample=torch.arange(b_n, device=dev), weight=(batch.completion_mask & prev_valid).float(),
        targets=batch.completion_ids, num_draws=1, batch_size=b_n, prompt_len=p, causal=True, images=batch.images,
    )
