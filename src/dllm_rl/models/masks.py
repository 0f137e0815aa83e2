"""Attention masks: the one place that decides who attends to whom.

Every mask is an *additive float* tensor of shape ``[batch, 1, queries, keys]`` (0 where attention is
allowed, ``finfo(dtype).min`` where it is not). A boolean 4D mask would be silently *added* as 0/1 by the
``eager`` kernel of transformers, so we never build one.

**Block boundaries (one definition for the whole library).** A token's position is the number of real
(non-pad) tokens before it in its sequence, counted from the first real token: ``cumsum(valid) - 1``.
Its block is ``position // block_size``. This is the rule of the published SDAR/TraDo *sampler*, which
aligns blocks to absolute positions, so a prompt whose length is not a multiple of the block size shares
its last block with the first response tokens. The sampler, the two-stream training layout, the trace
estimator and block SFT all call :func:`block_index`, so a trace recorded at inference lines up with what
training rebuilds. (The published SDAR *training* code counts prompt blocks back from the end of the
prompt instead; we do not, because then training and inference would see different blocks.)

**Streams.** Block-diffusion training puts a clean copy and a noisy copy of the response in one sequence
(``[prompt | clean | noisy]``). Each token carries a stream id (0 = prompt/clean, 1 = noisy):

* a stream-0 query sees stream-0 keys of the same or earlier blocks (block-causal);
* a stream-1 query sees stream-0 keys of strictly earlier blocks and stream-1 keys of its own block.

Plain block-causal attention is the case "everything in stream 0"; full attention ignores blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def position_ids_from_valid(valid: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: ``cumsum(valid) - 1`` (pads get 0)."""
    valid = valid.long()
    return (valid.cumsum(-1) - 1).clamp(min=0)


def block_index(position_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """The block of each token: ``position // block_size`` (see the module docstring)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return torch.div(position_ids, block_size, rounding_mode="floor")


def _to_additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias.unsqueeze(1)


def attention_bias(
    key_valid: torch.Tensor,
    *,
    query_block: torch.Tensor | None = None,
    key_block: torch.Tensor | None = None,
    query_stream: torch.Tensor | None = None,
    key_stream: torch.Tensor | None = None,
    num_queries: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Additive mask ``[B, 1, Tq, Tk]`` for the rule in the module docstring.

    ``key_valid`` is ``[B, Tk]``. Without blocks this is full (bidirectional) attention over valid keys;
    ``num_queries`` then gives Tq (default Tk). With ``query_block``/``key_block`` (``[B, Tq]``/``[B, Tk]``)
    it is block-causal, refined by the optional stream ids. Queries and keys may differ in length, which
    is how a KV-cached forward (queries = new tokens, keys = cache + new tokens) gets its mask.
    """
    key_valid = key_valid.bool()
    if query_block is None:
        tq = num_queries if num_queries is not None else key_valid.shape[1]
        allowed = key_valid[:, None, :].expand(-1, tq, -1)
        return _to_additive(allowed, dtype)
    if key_block is None:
        raise ValueError("attention_bias: key_block is required with query_block")
    qb = query_block[:, :, None]
    kb = key_block[:, None, :]
    if query_stream is None and key_stream is None:
        allowed = kb <= qb
    else:
        qs = (query_stream if query_stream is not None else torch.zeros_like(query_block))[:, :, None].bool()
        ks = (key_stream if key_stream is not None else torch.zeros_like(key_block))[:, None, :].bool()
        clean_rule = ~ks & (kb <= qb)
        noisy_rule = (~ks & (kb < qb)) | (ks & (kb == qb))
        allowed = torch.where(qs, noisy_rule, clean_rule)
    allowed = allowed & key_valid[:, None, :]
    return _to_additive(allowed, dtype)


def full_bias(valid: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bidirectional attention over the valid (non-pad) tokens of each row."""
    return attention_bias(valid, dtype=dtype)


def block_causal_bias(
    valid: torch.Tensor,
    block_size: int,
    position_ids: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Block-causal attention: a token sees its own block and all earlier blocks (valid keys only)."""
    pos = position_ids if position_ids is not None else position_ids_from_valid(valid)
    blk = block_index(pos, block_size)
    return attention_bias(valid, query_block=blk, key_block=blk, dtype=dtype)


@dataclass
class TwoStreamLayout:
    """One sequence per row holding ``[prompt | clean response | noisy copy]`` for block diffusion.

    ``input_ids``/``position_ids``/``bias`` feed the model. ``noisy_columns[b, j]`` is the column of the
    original (single-stream) sequence that noisy-stream slot ``j`` copies, or -1 for padding; use
    :meth:`noisy_logits` to read the noisy-stream logits back in the original column order.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    bias: torch.Tensor
    noisy_columns: torch.Tensor
    seq_len: int

    def noisy_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, T, V]`` logits in the original column order, taken from the noisy stream.

        Columns that have no noisy copy (the clean prefix blocks and padding) hold the clean-stream
        logits; callers only read the positions they scored.
        """
        out = logits[:, : self.seq_len].clone()
        b_idx, j_idx = torch.nonzero(self.noisy_columns >= 0, as_tuple=True)
        out[b_idx, self.noisy_columns[b_idx, j_idx]] = logits[b_idx, self.seq_len + j_idx]
        return out


def two_stream_layout(
    clean_ids: torch.Tensor,
    noisy_ids: torch.Tensor,
    valid: torch.Tensor,
    prompt_lengths: torch.Tensor,
    block_size: int,
    pad_token_id: int = 0,
    dtype: torch.dtype = torch.float32,
) -> TwoStreamLayout:
    """Build the two-stream training layout (SDAR / TraceRL block training) for one forward pass.

    ``clean_ids`` and ``noisy_ids`` are ``[B, T]`` (prompt + response, left-padded, same padding;
    ``noisy_ids`` is ``clean_ids`` with some response tokens replaced by the mask id). ``prompt_lengths``
    counts each row's real prompt tokens. Every block that holds a response token gets a noisy copy —
    including the prompt's last, partial block, whose prompt tokens are copied unmasked — so noisy block
    ``j`` sees exactly what the sampler's block ``j`` saw: the prompt and clean blocks ``< j`` plus itself.
    Noisy tokens take the position ids of the clean tokens they copy.
    """
    if clean_ids.shape != noisy_ids.shape or clean_ids.shape != valid.shape:
        raise ValueError("two_stream_layout: clean_ids, noisy_ids and valid must have the same shape")
    bsz, seq_len = clean_ids.shape
    device = clean_ids.device
    valid = valid.bool()
    pos = position_ids_from_valid(valid)
    blk = block_index(pos, block_size)
    first_block = torch.div(prompt_lengths.to(device), block_size, rounding_mode="floor")
    in_tail = valid & (blk >= first_block[:, None])
    tail_len = in_tail.sum(-1)
    n_noisy = int(tail_len.max().item()) if bsz else 0
    cols = torch.arange(seq_len, device=device).expand(bsz, -1)
    # Stable sort puts each row's tail columns first, in order.
    order = torch.sort((~in_tail).long() * seq_len + cols, dim=-1).indices[:, :n_noisy]
    slot_valid = torch.arange(n_noisy, device=device)[None, :] < tail_len[:, None]
    noisy_columns = torch.where(slot_valid, order, torch.full_like(order, -1))

    gather = order.clamp(min=0)
    noisy_tok = torch.where(slot_valid, noisy_ids.gather(1, gather), torch.full_like(gather, pad_token_id))
    noisy_pos = torch.where(slot_valid, pos.gather(1, gather), torch.zeros_like(gather))
    noisy_blk = torch.where(slot_valid, blk.gather(1, gather), torch.full_like(gather, -1))

    input_ids = torch.cat([clean_ids, noisy_tok], dim=1)
    position_ids = torch.cat([pos, noisy_pos], dim=1)
    all_valid = torch.cat([valid, slot_valid], dim=1)
    all_blk = torch.cat([blk, noisy_blk], dim=1)
    stream = torch.cat(
        [torch.zeros_like(valid, dtype=torch.long), torch.ones_like(slot_valid, dtype=torch.long)], dim=1
    )
    bias = attention_bias(
        all_valid, query_block=all_blk, key_block=all_blk, query_stream=stream, key_stream=stream, dtype=dtype
    )
    return TwoStreamLayout(input_ids, position_ids, bias, noisy_columns, seq_len)
