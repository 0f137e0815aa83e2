"""Grouped-query attention without copying the keys and values per query head.

Every forward of a diffusion LM carries a mask (block-causal, padding, the engine's slots), and transformers' SDPA
path then expands each key/value head to its query heads (``repeat_kv``: it keeps ``enable_gqa`` for unmasked
calls and a single query token, where the fused kernels take it). At 8B with 4 query heads per key head (SDAR, SDAR-MoE,
Dream, Fast-dLLM v2, LLaDA2 have 4-8) that copy is the largest memory traffic of a cached decoding step: 32 slots of
2k cached positions are ~270 MB of keys and values per layer, written 4x over and read back. Here the query heads
that share a key head are stacked along the query axis instead (``[B, H, L, D] -> [B, H_kv, G * L, D]``, the mask
repeated ``G`` times along its query axis: a query row's keys, values and mask row are unchanged), so SDPA reads each
key/value head once; the result is the same (bit for bit on CPU: ``tests/models/test_models_grouped_attention.py``).
Transformers' own ``pack_gqa`` does this for one query token only, hence this function; everything else (no groups,
no mask, a position bias, soft-capping, a long sequence whose mask stacked would outweigh the keys) is transformers'
``sdpa_attention_forward`` unchanged.

Models load with ``attn_implementation="sdpa"`` and run :func:`grouped_sdpa` under the registered name
:data:`GROUPED_SDPA` (``dllm_rl.models.loading`` maps one to the other).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "dllm_rl_grouped_sdpa"


def _stacked_mask(mask: torch.Tensor, key: torch.Tensor, heads: int, groups: int, queries: int) -> torch.Tensor | None:
    """``mask`` ``[B, 1 | H, L, K]`` laid out for query heads stacked ``[B, H_kv, G * L, K]``, or None where that
    does not pay. A per-head mask only changes its view; a mask shared by the heads is copied ``G`` times, which is
    worth it while it is smaller than the keys and values that repeating them would copy: always for a decoding
    step's block of queries, not for a long sequence (``L >= 2 x H_kv x D``: 2,048 for SDAR-8B, 1,024 for Dream-7B).
    A mask with one row for every query (``[B, 1, 1, K]``) broadcasts as it is."""
    b, h, q_len, k_len = mask.shape
    if q_len != queries:
        return mask if q_len == 1 and h == 1 else None
    if h == heads:
        return mask.reshape(b, heads // groups, groups * q_len, k_len)
    repeated_keys = key.shape[0] * key.shape[1] * key.shape[-1] * 2 * key.element_size()  # per key position
    if h != 1 or b * q_len * mask.element_size() >= repeated_keys:
        return None
    return mask[:, :, None].expand(b, 1, groups, q_len, k_len).reshape(b, 1, groups * q_len, k_len)


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: ``query`` ``[B, H, L, D]``, ``key``/``value`` ``[B, H_kv, K,
    D]``; returns ``[B, L, H, D]``."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_len, _ = query.shape
    plain = (groups <= 1 or q_len == 1 or attention_mask is None or attention_mask.ndim != 4
             or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
             or kwargs.get("output_attentions", False))
    mask = None if plain else _stacked_mask(attention_mask, key, heads, groups, q_len)
    if mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    stacked = query.reshape(batch, heads // groups, groups * q_len, query.shape[-1])
    out = F.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
