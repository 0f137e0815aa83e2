"""``trace``: TraceRL's trajectory-aware log-likelihood (arXiv 2509.06949).

TraceRL trains on the trajectory the model actually took at inference. The rollout records, for every
completion token, the decoding step at which it was committed (``step_map``); a trace of ``K`` steps
``tau(1..K)`` gives the policy

    log pi(y | x) = sum_k sum_{i in tau(k)} log p(y_i | x, y_{tau(<k)}, all later tokens masked)

With shrinkage ``s`` (the paper's "shrinkage parameter": neighbouring steps are aggregated to cut the
number of forwards) the trace is cut into merged steps of ``s`` consecutive steps, and each merged step
is scored from the state just before it:

* **Full-attention models** (LLaDA, Dream): merged step ``g = step // s`` over *global* steps. The row
  for merged step ``g`` masks every completion token with ``step >= g*s``, reveals earlier ones, keeps the
  prompt clean, and scores (weight 1) the counted tokens with ``step // s == g``. One row per merged step
  per sample that commits at least one counted token; rows are batched.
* **Block models** (SDAR / TraDo, ``model.is_block_causal``): within each block (the library's one block
  definition, :func:`dllm_rl.models.block_index`) the local step is ``step - (min step in that block)``
  and the merged local step is ``r = local // s``. ONE forward in the two-stream layout
  ``[prompt | clean response | noisy copy]`` scores merged step ``r`` of EVERY block: the noisy copy of
  each block is that block's state before its ``r``-th merged step (tokens with ``local // s >= r``
  masked), and the noisy block sees the prompt and the *clean* earlier blocks, exactly as the block
  sampler did. Cost per sample: ``ceil(steps_per_block / s)`` forwards of length ``prompt + 2 x response``
  (plus the prompt's partial last block, which is copied into the noisy stream unmasked).
  ``layout="per_step"`` runs a block model the plain way instead — one single-stream block-causal row per
  (block, merged local step), later blocks masked — which gives the same log-probs (tested) at more rows.

``step_merge=True`` (DARE's ``step_merge`` for CJ-GRPO, arXiv 2509.23924) merges all the steps of each
decoding block into one transition, whatever their number (threshold decoding gives blocks different step
counts, so no fixed shrinkage does this): the row of block ``j`` masks block ``j`` and every later block and
scores block ``j``'s counted tokens. Full-attention models decode semi-autoregressively in blocks of
``block_length`` completion tokens (the rollout's ``block_length``; the RL preset fills it); block models in their
layout block, where one two-stream forward scores every block from its all-masked state.

``info["transition"]`` (``[1, B, G]``) numbers each token's transition (merged step; for block models the
(block, merged local step) pair) in decoding order, -1 where never committed: a sample's tokens with one id were
committed by one transition (CJ-GRPO's loss averages its token terms per transition, :mod:`dllm_rl.rl.methods.cj_grpo`).

Tokens that are never committed (``step = -1``) or lie outside ``completion_mask`` (EOS padding after the
answer) get weight 0 and by default stay in the input as they are — unmasked clean context, the same
convention as the other estimators (the answer's end is visible). ``mask_uncounted=True`` instead masks
uncounted committed tokens according to their own recorded steps, rebuilding the exact inference state;
they are still not scored, and the EOS fill after an early stop (the never-committed uncounted tokens after
the last committed one, which the sampler held as masks while it decoded) is masked in every row. Other tokens
with step -1 (a rollout hook's prefilled tokens, clean from the start) are never masked. ``D = 1``; every
counted committed token is scored exactly once.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import block_index, position_ids_from_valid

LAYOUTS = ("auto", "two_stream", "per_step")


def merged_steps(
    batch: ScoringBatch, shrinkage: int, block_size: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(merged, block)``, both ``[B, G]``: TraceRL's shrinkage (arXiv 2509.06949, the shrinkage parameter
    ``s`` of its TraceRL section) merges every ``s`` consecutive decoding steps into one.

    ``merged`` is ``step // s`` (full attention, ``block_size=None``) or ``(step - block's min step) // s``
    (block models), -1 for tokens never committed. ``block`` is each completion token's block index
    (``None`` for full attention). The block's min step is taken over all its committed completion
    tokens, counted or not (the block's decoding started then).
    """
    if batch.step_map is None:
        raise ValueError("the trace estimator needs batch.step_map (the rollout's decoding trace)")
    step = batch.step_map.long()
    committed = step >= 0
    if block_size is None:
        return torch.where(committed, torch.div(step, shrinkage, rounding_mode="floor"), -1), None
    p = batch.prompt_len
    blk = block_index(position_ids_from_valid(batch.valid()), block_size)[:, p:]
    big = torch.iinfo(torch.long).max
    first = torch.full((batch.batch_size, int(blk.max().item()) + 1 if blk.numel() else 1), big, device=step.device)
    first = first.scatter_reduce(1, blk, torch.where(committed, step, big), reduce="amin")
    local = step - first.gather(1, blk)
    merged = torch.where(committed, torch.div(local, shrinkage, rounding_mode="floor"), -1)
    return merged, blk


def block_merged_steps(
    batch: ScoringBatch, block_size: int | None, block_length: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(merged, block)`` as :func:`merged_steps` returns them, with every decoding block's steps merged into one
    (DARE's ``step_merge`` for CJ-GRPO, arXiv 2509.23924): block models (``block_size`` set) get merged local step 0
    in every block; full-attention models get the index of the token's semi-autoregressive block of
    ``block_length`` completion tokens as its merged step (the sampler decodes the blocks in order). -1 for tokens
    never committed."""
    if block_size is not None:
        merged, blk = merged_steps(batch, 1, block_size)
        return torch.where(merged >= 0, 0, -1), blk
    if block_length is None:
        raise ValueError("step_merge on a full-attention model needs block_length (the rollout's semi-autoregressive "
                         "block, rollout.block_length)")
    if batch.step_map is None:
        raise ValueError("the trace estimator needs batch.step_map (the rollout's decoding trace)")
    pos = torch.arange(batch.completion_len, device=batch.step_map.device).expand_as(batch.step_map)
    return torch.where(batch.step_map >= 0, torch.div(pos, block_length, rounding_mode="floor"), -1), None


def decoding_order(merged: torch.Tensor, blk: torch.Tensor | None) -> torch.Tensor:
    """``[B, G]``: an id of each token's merged step that increases in decoding order (-1: never committed).

    Full attention (``blk is None``): the merged global step itself. Block models: the lexicographic
    (block, merged local step) order, which is the block sampler's decoding order."""
    if blk is None:
        return merged
    span = int(merged.max().item()) + 1 if merged.numel() else 1
    return torch.where(merged >= 0, blk * span + merged, -1)


def _early_stop_fill(batch: ScoringBatch) -> torch.Tensor:
    """``[B, G]`` bool: the EOS fill after an early stop (``DecodeConfig.stop_on_eos``): uncounted tokens never
    committed (step -1) that follow the sample's last committed token. The sampler held them as masks in every
    step it ran (:mod:`dllm_rl.sampling`: "-1 = never generated")."""
    step = batch.step_map
    if step.numel() == 0:
        return torch.zeros_like(batch.completion_mask)
    pos = torch.arange(batch.completion_len, device=step.device).expand_as(step)
    last = torch.where(step >= 0, pos, -1).amax(-1, keepdim=True)
    return (step < 0) & (pos > last) & ~batch.completion_mask


@register("trace")
def plan_trace(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator | None = None,
    *,
    shrinkage: int = 1,
    layout: str = "auto",
    mask_uncounted: bool = False,
    step_merge: bool = False,
    block_length: int | None = None,
) -> MaskedRows:
    """TraceRL's trace log-likelihood with shrinkage ``s`` (arXiv 2509.06949, trajectory-aware RL with
    shrinkage; see the module docstring for the per-step states and the block two-stream layout).

    ``layout``: ``"auto"`` (two-stream for block models, one row per merged step otherwise),
    ``"two_stream"`` (block models only) or ``"per_step"``. ``step_merge``: one transition per decoding block
    (full attention: blocks of ``block_length`` completion tokens; instead of ``shrinkage``, which must stay 1).
    ``info["merged_step"]``: ``[1, B, G]`` merged (local, for block models) step of each token, -1 if never
    committed; ``info["transition"]``: the id of each token's transition in decoding order (module docstring).
    Deterministic: the generator is accepted for the common signature and not used.
    """
    s = check_int("shrinkage", shrinkage, 1)
    if not isinstance(step_merge, bool):
        raise ValueError(f"step_merge must be true or false, got {step_merge!r}")
    if step_merge and s != 1:
        raise ValueError(f"step_merge merges each block's steps into one transition; shrinkage must be 1 with it, "
                         f"got {s}")
    if block_length is not None and not (step_merge and not model.is_block_causal):
        raise ValueError("block_length is the semi-autoregressive block that step_merge merges on a full-attention "
                         "model; block models merge their layout block, and without step_merge it is not read")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    block = model.is_block_causal
    if layout == "two_stream" and not block:
        raise ValueError("layout='two_stream' needs a block model (model.is_block_causal); use 'per_step'")
    two_stream = block and layout in ("auto", "two_stream")
    if step_merge:
        length = None if block_length is None else check_int("block_length", block_length, 1)
        merged, blk = block_merged_steps(batch, model.layout_block(batch.block_size), length)
    else:
        merged, blk = merged_steps(batch, s, model.layout_block(batch.block_size))
    committed = merged >= 0
    counted = committed & batch.completion_mask
    maskable = committed & (batch.completion_mask | mask_uncounted)
    fill = _early_stop_fill(batch) if mask_uncounted else torch.zeros_like(committed)
    key = decoding_order(merged, blk) if block and not two_stream else merged

    samples, masks, weights = [], [], []
    for b in range(batch.batch_size):
        groups = torch.unique(key[b][counted[b]])  # sorted
        if groups.numel() == 0:
            continue
        k = key[b][None, :]
        g = groups[:, None]
        masks.append((maskable[b][None, :] & (k >= g)) | fill[b][None, :])
        weights.append((counted[b][None, :] & (k == g)).float())
        samples.append(torch.full((groups.numel(),), b, dtype=torch.long, device=key.device))
    dev = batch.completion_ids.device
    if samples:
        sample, masked, weight = torch.cat(samples), torch.cat(masks), torch.cat(weights)
    else:
        g_n = batch.completion_len
        sample = torch.zeros(0, dtype=torch.long, device=dev)
        masked = torch.zeros(0, g_n, dtype=torch.bool, device=dev)
        weight = torch.zeros(0, g_n, device=dev)
    return build_rows(
        batch, sample, torch.zeros_like(sample), masked, weight, model.mask_token_id, 1,
        info={"merged_step": merged[None], "transition": decoding_order(merged, blk)[None]}, two_stream=two_stream,
    )

