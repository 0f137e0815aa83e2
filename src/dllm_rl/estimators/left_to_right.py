"""``left_to_right``: JustGRPO's exact likelihood in left-to-right order (arXiv 2601.15165).

``log pi(y|x) = sum_i log p(y_i | x, y_{<i}, [MASK] * (G - i))``: token ``i`` is read with the prompt and the
earlier tokens clean and itself and *every later token masked*, under the model's own (full) attention. This is
not the ``ar`` estimator (a causal mask over the clean sequence, right for models adapted from AR ones): here the
future is present as mask tokens, as the sampler shows it.

Deterministic. Full attention: one row per counted token ``i`` (completion
columns ``>= i`` masked, weight 1 on ``i``); ``G`` rows per sample. Block models (two-stream layout, where
a block sees the clean earlier blocks and only its own noisy state): row ``j`` masks in-block offsets
``>= j`` of every block and scores offset ``j`` of each, which is the same left-to-right likelihood in
``block_size`` rows.

Deviation: JustGRPO's released code also scores the EOS padding after the answer; here only counted tokens are
scored (padding stays masked as the future).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import position_ids_from_valid


@register("left_to_right")
def plan_left_to_right(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator | None = None
) -> MaskedRows:
    """JustGRPO's exact left-to-right likelihood (arXiv 2601.15165, method section): token ``i`` scored with
    every completion token ``>= i`` masked (see the module docstring). The generator is not used."""
    b_n, g_n = batch.batch_size, batch.completion_len
    dev = batch.completion_ids.device
    g = torch.arange(g_n, device=dev)
    valid = batch.valid()[:, batch.prompt_len :]
    if model.is_block_causal:  # offsets inside the (absolute) blocks of the library's block rule
        n_rows = model.layout_block(batch.block_size)
        offset = position_ids_from_valid(batch.valid())[:, batch.prompt_len :] % n_rows
    else:
        n_rows, offset = g_n, g[None, :].expand(b_n, -1)
    j = torch.arange(n_rows, device=dev)[:, None, None]  # [J, 1, 1]
    masked = (offset[None] >= j) & valid[None]  # [J, B, G]
    weight = ((offset[None] == j) & batch.completion_mask[None]).float()
    keep = weight.ne(0).any(-1)  # [J, B]
    rows_j, rows_b = torch.nonzero(keep, as_tuple=True)
    return build_rows(
        batch, rows_b, torch.zeros_like(rows_b), masked[rows_j, rows_b], weight[rows_j, rows_b],
        model.mask_token_id, 1, two_stream=model.is_block_causal,
    )
