"""``block``: block-diffusion noising, one noise level per block (BD3-LM; SDAR's training layout).

The block-diffusion NELBO is a sum over blocks, each block denoised given the clean earlier blocks
(BD3-LM, Arriola et al. 2025, arXiv 2503.09573, Eq. 8; SDAR arXiv 2510.06303 trains block models this way):

    -sum_k E_{t_k} [ (1/t_k) sum_{i in block k masked} log p(y_i | prompt, y_{<k}, y_k^{t_k}) ]

Block models score every block in one forward of the two-stream layout (noisy block ``k`` sees the prompt,
the clean blocks ``< k`` and itself). Full-attention models use the sliced form: one random block of the
semi-autoregressive decoding blocks per sample, an unbiased estimate of the same sum. The SFT ``block``
objective divides the weighted sum by the response length (:func:`dllm_rl.sft.objectives.sequence_loss`).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import RowRandom, build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.masks import block_index, position_ids_from_valid


def _two_stream_rows(
    model: DiffusionLM, batch: ScoringBatch, rng: RowRandom, eps: float, block_size: int | None,
    mask_ratio: float | None,
) -> MaskedRows:
    """Block models: every block holding response tokens draws its own ``t_k``; one two-stream row per sample."""
    bs = model.layout_block(batch.block_size)
    if block_size is not None and block_size != bs:
        raise ValueError(f"block estimator: block_size={block_size} but the batch is laid out at block {bs}; leave "
                         "block_size unset (SFT: objective.block_size: null)")
    b_n, g_n, p = batch.batch_size, batch.completion_len, batch.prompt_len
    counted = batch.completion_mask
    dev = counted.device
    comp_blk = block_index(position_ids_from_valid(batch.valid()), bs)[:, p:]
    n_blk = int(comp_blk.max().item()) + 1 if g_n else 1
    u = rng.rand(n_blk).to(dev)
    t_blk = torch.full_like(u, float(mask_ratio)) if mask_ratio is not None else eps + (1.0 - eps) * u
    t_tok = t_blk.gather(1, comp_blk.clamp(min=0, max=n_blk - 1))
    masked = (rng.rand(g_n).to(dev) < t_tok) & counted
    sample, draw = torch.arange(b_n, device=dev), torch.zeros(b_n, dtype=torch.long, device=dev)
    return build_rows(batch, sample, draw, masked, masked / t_tok, model.mask_token_id, 1,
                      info={"mask_ratio": t_blk}, two_stream=True)


def _sliced_rows(
    model: DiffusionLM, batch: ScoringBatch, rng: RowRandom, eps: float, block_size: int | None,
    mask_ratio: float | None,
) -> MaskedRows:
    """Full attention: one block ``k`` of the ``n_b`` response blocks per sample, weight ``n_b / t``."""
    if block_size is None:
        raise ValueError("the block estimator on a full-attention model needs block_size, the semi-autoregressive "
                         "decoding block_length (SFT: objective.block_size)")
    b_n, g_n, p = batch.batch_size, batch.completion_len, batch.prompt_len
    counted = batch.completion_mask
    dev = counted.device
    comp_blk = torch.arange(g_n, device=dev)[None, :].expand(b_n, -1) // block_size
    lengths = counted.sum(-1)
    n_blocks = torch.div(lengths + block_size - 1, block_size, rounding_mode="floor").clamp(min=1)
    u = rng.rand(2).to(dev)
    k = (u[:, 0] * n_blocks).floor().long().clamp(max=n_blocks - 1)
    t = torch.full_like(u[:, 1], float(mask_ratio)) if mask_ratio is not None else eps + (1.0 - eps) * u[:, 1]
    r = rng.rand(g_n).to(dev)
    current = (comp_blk == k[:, None]) & (r < t[:, None]) & counted
    later = (comp_blk > k[:, None]) & batch.valid()[:, p:]
    weight = current * (n_blocks.float() / t)[:, None]
    sample, draw = torch.arange(b_n, device=dev), torch.zeros(b_n, dtype=torch.long, device=dev)
    return build_rows(batch, sample, draw, current | later, weight, model.mask_token_id, 1,
                      info={"mask_ratio": t[:, None], "block": k})


@register("block")
def plan_block(
    model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator, *, eps: float = 1e-3,
    block_size: int | None = None, mask_ratio: float | None = None,
) -> MaskedRows:
    """Block diffusion noising (BD3-LM arXiv 2503.09573 Eq. 8, the NELBO summed over blocks; SDAR arXiv
    2510.06303's training layout). All randomness is drawn here, from ``generator`` only.

    Block models (two-stream): blocks are ``position // block_size`` (:func:`block_index`); every block
    ``k`` holding response tokens draws ``t_k ~ U(eps, 1)``, masks each of its response tokens with
    probability ``t_k`` and weights the masked ones ``1/t_k``; the row carries ``clean_ids`` so it is run
    in the ``[prompt | clean | noisy]`` layout. Full attention (sliced): blocks count from the response
    start (semi-AR decoding blocks); one block ``k`` of the ``n_b`` response blocks is drawn uniformly,
    earlier blocks stay clean, block ``k`` is masked with probability ``t`` and later blocks fully; masked
    tokens of block ``k`` get weight ``n_b / t`` — an unbiased estimate of the same sum over blocks.
    ``mask_ratio`` pins ``t``. ``info``: ``mask_ratio`` (``[B, n_blocks]`` or ``[B, 1]``), ``block`` (sliced
    form: ``[B]``).
    """
    rng = RowRandom(generator, batch)
    rows = _two_stream_rows if model.is_block_causal else _sliced_rows
    return rows(model, batch, rng, eps, block_size, mask_ratio)
