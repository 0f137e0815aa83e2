"""Drawing the rows a planner forwards: the only randomness (:class:`RowRandom`) and the masked rows.

All randomness is drawn by the planners, from the caller's generator only, before any forward, so the masks
do not depend on ``max_rows`` or on the model.

Block models (``model.is_block_causal``) get every row in the two-stream layout (noisy copy of the
completion next to the clean sequence, :func:`dllm_rl.models.masks.two_stream_layout`; SDAR arXiv 2510.06303
and TraceRL arXiv 2509.06949 train block models this way): a token of block ``j`` sees the prompt, *clean*
blocks ``< j`` and the masked state of its own block, which is the only context the block sampler ever gives
it. (A single masked sequence would show later blocks masked earlier blocks, a state the sampler never
produces.)
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import block_index, position_ids_from_valid


class RowRandom:
    """Uniform draws of shape ``[B, *shape]`` from the caller's generator only.

    Without ``batch.sample_seeds`` this is ``torch.rand((B, *shape), generator=generator)``. With them,
    one base seed is drawn from ``generator`` and each sample gets its own generator seeded from
    ``(base, sample_seed)``, so a sample's draws do not depend on the rest of the batch. Numbers are drawn
    on the generator's device (CPU generators work with GPU models).
    """

    def __init__(self, generator: torch.Generator, batch: ScoringBatch):
        if not isinstance(generator, torch.Generator):
            raise ValueError(
                f"estimators need an explicit torch.Generator (got {type(generator).__name__}); the global RNG "
                "is never used so that old / reference / current policies see the same masks"
            )
        self.generator = generator
        self.batch_size = batch.batch_size
        self.per_sample: list[torch.Generator] | None = None
        if batch.sample_seeds is not None:
            base = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            self.per_sample = []
            for s in batch.sample_seeds.tolist():
                g = torch.Generator(device=generator.device)
                g.manual_seed((base * 6364136223846793005 + int(s) * 1442695040888963407 + 1) % (2**63))
                self.per_sample.append(g)

    def rand(self, *shape: int) -> torch.Tensor:
        dev = self.generator.device
        if self.per_sample is None:
            return torch.rand((self.batch_size, *shape), generator=self.generator, device=dev)
        if not self.per_sample:
            return torch.empty((0, *shape), device=dev)
        return torch.stack([torch.rand(shape, generator=g, device=dev) for g in self.per_sample])

    def randint(self, high: int, *shape: int) -> torch.Tensor:
        """Uniform integers in ``[0, high)`` of shape ``[B, *shape]`` (exactly uniform, unlike ``floor(rand * high)``
        at a vocabulary that does not divide 2^24), from the same streams as :meth:`rand`."""
        dev = self.generator.device
        if self.per_sample is None:
            return torch.randint(0, high, (self.batch_size, *shape), generator=self.generator, device=dev)
        if not self.per_sample:
            return torch.empty((0, *shape), dtype=torch.long, device=dev)
        return torch.stack([torch.randint(0, high, shape, generator=g, device=dev) for g in self.per_sample])


def build_rows(
    batch: ScoringBatch,
    sample: torch.Tensor,
    draw: torch.Tensor,
    masked: torch.Tensor,
    weight: torch.Tensor,
    mask_token_id: int,
    num_draws: int,
    *,
    mask_uncounted: bool = False,
    prompt_masked: torch.Tensor | None = None,
    info: dict[str, torch.Tensor] | None = None,
    two_stream: bool = False,
) -> MaskedRows:
    """Rows for samples ``sample`` (``[R]``) with completion tokens ``masked`` (``[R, G]``) replaced by
    the mask id (plus every uncounted valid completion token when ``mask_uncounted``, plus prompt tokens
    ``prompt_masked`` ``[R, P]`` if given), weights ``weight`` (``[R, G]``).

    ``two_stream`` (block models): the rows run in the two-stream layout; the clean stream is the sample
    with only ``prompt_masked`` applied, the noisy copy is the masked row."""
    ids = batch.input_ids()[sample]
    valid = batch.valid()[sample]
    p = batch.prompt_len
    if two_stream and prompt_masked is not None:
        clean = ids.clone()
        clean[:, :p] = torch.where(prompt_masked.bool() & valid[:, :p], mask_token_id, ids[:, :p])
    else:
        clean = ids
    comp_masked = masked.bool()
    if mask_uncounted:
        comp_valid = valid[:, p:]
        comp_masked = comp_masked | (comp_valid & ~batch.completion_mask[sample])
    full_mask = torch.cat(
        [prompt_masked.bool() if prompt_masked is not None else torch.zeros_like(ids[:, :p], dtype=torch.bool),
         comp_masked],
        dim=1,
    ) & valid
    ids = torch.where(full_mask, torch.full_like(ids, mask_token_id), ids)
    return MaskedRows(
        input_ids=ids, valid=valid, draw=draw.long(), sample=sample.long(), weight=weight.float(),
        targets=batch.completion_ids, num_draws=num_draws, batch_size=batch.batch_size, prompt_len=p,
        clean_ids=clean if two_stream else None,
        prompt_lengths=batch.prompt_mask.sum(-1)[sample] if two_stream else None,
        info=dict(info or {}), images=batch.images,
    )


def draw_rows(
    model: DiffusionLM,
    batch: ScoringBatch,
    parts: list[tuple[torch.Tensor, torch.Tensor]],
    num_draws: int,
    *,
    first_draws: list[int] | None = None,
    mask_uncounted: bool = False,
    prompt_masked: torch.Tensor | None = None,
    info: dict[str, torch.Tensor] | None = None,
) -> MaskedRows:
    """Rows from per-draw masks: each part is ``(masked, weight)``, both ``[B, D_k, G]``, laid out draw-major
    (row ``d * B + b``) with draw ids ``first_draws[k] + d`` (default 0); parts are concatenated in order and
    rows that mask nothing are dropped. ``prompt_masked`` (``[B, D, P]``) goes with a single part. Block models
    get two-stream rows (see the module docstring)."""
    if prompt_masked is not None and len(parts) != 1:
        raise ValueError("prompt_masked needs exactly one part")
    first_draws = first_draws or [0] * len(parts)
    if len(first_draws) != len(parts):
        raise ValueError(f"first_draws has {len(first_draws)} entries for {len(parts)} parts")
    masks, weights, draws, samples = [], [], [], []
    for (masked, weight), first in zip(parts, first_draws):
        b_n, d_n, g_n = masked.shape
        dev = masked.device
        masks.append(masked.transpose(0, 1).reshape(d_n * b_n, g_n))
        weights.append((masked * weight).transpose(0, 1).reshape(d_n * b_n, g_n).float())
        draws.append(first + torch.arange(d_n, device=dev).repeat_interleave(b_n))
        samples.append(torch.arange(b_n, device=dev).repeat(d_n))
    masked, weight = torch.cat(masks), torch.cat(weights)
    keep = masked.any(-1)
    pm = None if prompt_masked is None else prompt_masked.transpose(0, 1).reshape(masked.shape[0], -1)[keep]
    return build_rows(
        batch, torch.cat(samples)[keep], torch.cat(draws)[keep], masked[keep], weight[keep], model.mask_token_id,
        num_draws, mask_uncounted=mask_uncounted, prompt_masked=pm, info=info, two_stream=model.is_block_causal,
    )


def completion_segments(model: DiffusionLM, batch: ScoringBatch) -> tuple[torch.Tensor, int]:
    """``([B, G] long, S)``: the independent noise segment of each completion token and how many there can be.

    Full-attention models: one segment (all zeros, ``S = 1``). Block models: the token's block (the library's
    block rule on real-token positions), counted from the block holding the sample's first completion token;
    ``S`` covers a completion that starts at any offset inside a block. In the two-stream layout the blocks
    are scored independently of each other's masks, so per-block noise levels are the block model's ELBO
    (the block-diffusion NELBO is a sum over blocks, BD3-LM arXiv 2503.09573 Eq. 8)."""
    b_n, g_n = batch.completion_ids.shape
    dev = batch.completion_ids.device
    if not model.is_block_causal:
        return torch.zeros(b_n, g_n, dtype=torch.long, device=dev), 1
    bs = model.layout_block(batch.block_size)
    blk = block_index(position_ids_from_valid(batch.valid()), bs)[:, batch.prompt_len :]
    first = torch.div(batch.prompt_mask.sum(-1), bs, rounding_mode="floor")
    seg = (blk - first[:, None]).clamp(min=0)
    return seg.to(dev), (bs + g_n - 2) // bs + 1


def decoding_blocks(model: DiffusionLM, batch: ScoringBatch, block_length: int | None) -> torch.Tensor:
    """``[B, G]``: the decoding block of each completion token, counted from the completion's first block (block
    models: their layout's blocks; full attention: ``block_length`` columns each, or one block when ``None``)."""
    if model.is_block_causal:
        return completion_segments(model, batch)[0]
    g = torch.arange(batch.completion_len, device=batch.completion_ids.device)
    seg = g // block_length if block_length else torch.zeros_like(g)
    return seg[None, :].expand(batch.batch_size, -1)
