"""``mean_field``: the one-step estimator of d1's diffu-GRPO (arXiv 2504.12216).

diffu-GRPO approximates each token's log-likelihood by a single forward in which the whole completion is
masked ("mean-field" decomposition of the sequence log-probability):

    log pi(y | x) ~= sum_k log p(y_k | x', [MASK] * L)

with the prompt ``x'`` randomly perturbed: each prompt token (an image position never) is masked independently
with probability ``p_mask = 0.15`` (d1's default), a fresh mask per policy-gradient iteration — here one mask per draw,
drawn from the caller's generator so that old / current / reference policies share it.

Every counted completion token is masked and gets weight 1. Tokens outside ``completion_mask`` stay as
clean context unless ``mask_uncounted=True`` (d1's code masks the whole generated completion; set it to
reproduce that). Prompt padding is never masked.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int, check_unit_interval
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, draw_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("mean_field")
def plan_mean_field(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator,
    *,
    p_mask_prompt: float = 0.15,
    num_mc: int = 1,
    mask_uncounted: bool = False,
) -> MaskedRows:
    """d1 diffu-GRPO's one-step log-likelihood (arXiv 2504.12216, diffu-GRPO section, "efficient log
    probability estimation": the mean-field decomposition of the sequence log-probability with one-step
    per-token estimates): completion fully masked, prompt tokens masked with probability ``p_mask_prompt``.

    One row per sample and draw (``num_mc`` independent prompt masks, default 1); weight 1 on every
    counted completion token. ``info["prompt_masked"]``: ``[D, B, P]`` bool.
    """
    p = check_unit_interval("p_mask_prompt", p_mask_prompt)
    d_n = check_int("num_mc", num_mc, 1)
    rng = RowRandom(generator, batch)
    dev = batch.completion_ids.device
    prompt_draw = rng.rand(d_n, batch.prompt_len).to(dev) < p  # [B, D, P]
    prompt_masked = prompt_draw & (batch.prompt_mask & ~batch.image_mask())[:, None, :]  # images: never masked
    masked = batch.completion_mask[:, None, :].expand(-1, d_n, -1)
    return draw_rows(
        model, batch, [(masked, masked.float())], d_n, mask_uncounted=mask_uncounted, prompt_masked=prompt_masked,
        info={"prompt_masked": prompt_masked.transpose(0, 1)},
    )

