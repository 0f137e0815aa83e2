"""Scoring planned rows: run them through the model and gather float32 log-probs of the scored tokens.

This is the one row scorer every estimator shares (:func:`dllm_rl.estimators.estimate` plans the rows with
the registered planner, then calls :func:`score_rows`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dllm_rl.estimators.batch import MaskedRows, TokenScores
from dllm_rl.models.diffusion_lm import DiffusionLM, Selection
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE, check_chunk_size
from dllm_rl.models.masks import block_causal_bias, position_ids_from_valid, two_stream_layout


def _block_of(model: DiffusionLM, rows: MaskedRows) -> int | None:
    """The block of ``rows``' layout (set by :func:`dllm_rl.estimators.plan_rows`; the model's own when unset)."""
    return model.layout_block(rows.block_size)


def _two_stream_inputs(
    model: DiffusionLM, rows: MaskedRows, idx: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Model inputs of rows ``idx`` in the two-stream layout ``[prompt | clean | noisy copy]`` (SDAR arXiv
    2510.06303 / TraceRL arXiv 2509.06949 block training; :func:`dllm_rl.models.masks.two_stream_layout`) and
    ``col[r, g]``, the output column of completion token ``g``'s noisy copy (-1 for right padding). For a
    shifted family (Fast-dLLM v2) ``col`` is the raw-logits column that scores the token
    (:func:`_shifted_columns`) and the model is asked for raw logits."""
    device = ids.device
    layout = two_stream_layout(
        rows.clean_ids[idx].to(device), ids, valid, rows.prompt_lengths[idx].to(device), _block_of(model, rows),
        pad_token_id=model.pad_token_id, dtype=model.dtype,
    )
    inputs = {"input_ids": layout.input_ids, "position_ids": layout.position_ids, "attn_bias": layout.bias}
    seq = layout.seq_len
    # noisy slot j copies original column noisy_columns[r, j]; invert that map for the completion columns.
    slot_of = torch.full((ids.shape[0], seq), -1, dtype=torch.long, device=device)
    r_idx, j_idx = torch.nonzero(layout.noisy_columns >= 0, as_tuple=True)
    slot_of[r_idx, layout.noisy_columns[r_idx, j_idx]] = j_idx
    comp_slot = slot_of[:, rows.prompt_len :]
    # Every valid response column has a noisy copy; invalid (right-padding) columns get -1 (never scored).
    col = torch.where(comp_slot >= 0, seq + comp_slot, -1)
    if model.family.shift:
        inputs["align"] = False
        raw_col = _shifted_columns(layout, _block_of(model, rows)).gather(1, (col - seq).clamp(min=0))
        col = torch.where(col >= 0, raw_col, -1)
    return inputs, col


def _shifted_columns(layout, block_size: int) -> torch.Tensor:
    """``[B, n_noisy]``: the raw-logits column that scores noisy slot ``j`` of a shifted family: the previous
    noisy slot within the same block, and for a block's first token the clean column of the position before
    it (which sees the clean blocks before, as the block sampler's last logit of the previous block does);
    position 0 reads its own column (as :meth:`~dllm_rl.models.DiffusionLM.align_logits`)."""
    seq = layout.seq_len
    cols = layout.noisy_columns
    n = cols.shape[1]
    pos = layout.position_ids[:, seq:]
    own = seq + torch.arange(n, device=cols.device).expand_as(cols)
    first_of_block = (pos % block_size == 0) | (torch.arange(n, device=cols.device) == 0)[None, :]
    from_clean = torch.where(pos > 0, cols - 1, own)
    return torch.where(first_of_block, from_clean, own - 1)


def row_inputs(
    model: DiffusionLM, rows: MaskedRows, idx: torch.Tensor, device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Model inputs of rows ``idx`` and ``col[r, g]``, the output column that scores completion token ``g``
    (the value model reads its values at the same columns, :mod:`dllm_rl.rl.value`). Rows of a batch with images
    get the splice of their samples' features at their prompt columns (``splice``)."""
    ids = rows.input_ids[idx].to(device)
    valid = rows.valid[idx].to(device)
    p, g = rows.prompt_len, rows.completion_len
    if rows.clean_ids is not None:
        return _two_stream_inputs(model, rows, idx, ids, valid)
    cols = torch.arange(p, p + g, device=device).expand(ids.shape[0], -1)
    extra = {}
    if rows.images is not None:
        starts = p - valid[:, :p].sum(-1)
        extra["splice"] = rows.images.splice(starts, ids.shape[1], rows.sample[idx])
    if not rows.causal:
        return {"input_ids": ids, "attention_mask": valid, "block_size": _block_of(model, rows), **extra}, cols
    # Causal rows: token c is predicted by the raw logits at c - 1, which a shifted family (Dream) already
    # aligns to column c.
    pos = position_ids_from_valid(valid)
    bias = block_causal_bias(valid, 1, pos, dtype=model.dtype)  # block size 1 = causal
    inputs = {"input_ids": ids, "position_ids": pos, "attn_bias": bias, **extra}
    return inputs, cols if model.family.shift else cols - 1


def _scored_logp(
    model: DiffusionLM, rows: MaskedRows, idx: torch.Tensor, w: torch.Tensor, chunk_size: int, entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Run rows ``idx`` (weights ``w`` ``[r, G]``) and return ``(logp [N], rr, gg, width)``: the float32
    log-prob of completion token ``gg[n]`` of row ``rr[n]`` for every scored token, and the model input width
    (``entropy``: the entropy of the predicted distribution at that token instead of its log-prob).

    ``chunk_size > 0``: inside the model's forward the LM head projects the scored positions ``chunk_size``
    at a time (:class:`~dllm_rl.models.diffusion_lm.Selection`), so no
    ``[positions, V]`` logits of the whole call ever exist. ``0``: the logits of the columns from the first
    scored one to the end (``logits_to_keep``: scored tokens always sit in the last columns of the model
    input, the completion of ``[prompt | completion]`` or the two-stream noisy copy), then one float32
    log-softmax over the scored positions.
    """
    device = w.device
    inputs, col = row_inputs(model, rows, idx, device)
    width = int(inputs["input_ids"].shape[1])
    rr, gg = torch.nonzero(w.ne(0), as_tuple=True)
    out_col = col[rr, gg]
    if bool((out_col < 0).any()):
        raise RuntimeError("a scored completion token has no output column (scored a non-existent token?)")
    target = rows.targets[rows.sample[idx]].to(device)[rr, gg]
    if chunk_size:
        # columns asked for unaligned (the shifted two-stream layout) already name the raw column
        select = Selection(rr, out_col, None if entropy else target, chunk_size, aligned=inputs.pop("align", True))
        return model(**inputs, select=select).logprobs, rr, gg, width
    first = int(out_col.min().item()) if out_col.numel() else width - 1
    logits = model(**inputs, logits_to_keep=width - first).logits
    logp = torch.log_softmax(logits[rr, out_col - first].float(), dim=-1)
    if entropy:
        return -(logp.exp() * logp).sum(-1), rr, gg, width
    return logp.gather(-1, target[:, None]).squeeze(-1), rr, gg, width


def score_rows(
    model: DiffusionLM, rows: MaskedRows, max_rows: int | None = None, logprob_chunk_size: int = DEFAULT_CHUNK_SIZE,
    agree_calls: Callable[[int], int] | None = None, entropy: bool = False,
) -> TokenScores:
    """Forward ``rows`` (``max_rows`` at a time) and gather float32 log-probs of the scored tokens.

    Only rows with a non-zero weight are run, and only the scored positions are projected onto the
    vocabulary: ``logprob_chunk_size`` of them at a time, recomputed in backward (memory independent of the
    vocabulary and of the number of scored tokens; 0 = all of a call's scored positions at once, from the
    model's logits). The log-softmax is float32. Gradients flow to the model through ``logp`` when called
    under grad (every call's graph is kept until backward: micro-batch the :class:`ScoringBatch` to bound
    training memory).

    ``agree_calls`` (sharded parameters, :func:`dllm_rl.training.ranks.forward_agreement`; a collective, so
    every rank must make this call): maps this call's number of model calls to the number every rank makes,
    and the difference runs as one-token forwards whose output enters ``logp`` times 0. Under FSDP2 / ZeRO-3
    every forward (and its backward) gathers parameters, so ranks whose rows need fewer calls (``max_rows``,
    no scored token) would otherwise leave the others waiting.

    ``entropy`` (no gradient): ``logp`` holds the entropy (nats) of the model's full-vocabulary distribution at
    each scored token instead of its log-prob, computed as chunked (IGPO's entropy filter,
    :mod:`dllm_rl.rl.inpaint_filter`).
    """
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
    check_chunk_size(logprob_chunk_size)
    device = model.device
    d_n, b_n, g_n = rows.num_draws, rows.batch_size, rows.completion_len
    weight_rows = rows.weight.float()
    live = torch.nonzero(weight_rows.ne(0).any(-1), as_tuple=True)[0]
    r_sel, g_sel = torch.nonzero(weight_rows.ne(0), as_tuple=True)
    d_sel, b_sel = rows.draw[r_sel], rows.sample[r_sel]
    count = torch.zeros(d_n, b_n, g_n, dtype=torch.long)
    count.index_put_((d_sel.cpu(), b_sel.cpu(), g_sel.cpu()), torch.ones_like(g_sel.cpu()), accumulate=True)
    if int(count.max().item() if count.numel() else 0) > 1:
        raise RuntimeError("estimator plan scores a token twice in one draw")
    weight = torch.zeros(d_n, b_n, g_n, dtype=torch.float32, device=device)
    weight[d_sel.to(device), b_sel.to(device), g_sel.to(device)] = weight_rows[r_sel, g_sel].to(device)

    values: list[torch.Tensor] = []
    where: list[torch.Tensor] = []
    calls = 0
    tokens = 0
    chunk = max(len(live) if max_rows is None else max_rows, 1)
    starts = list(range(0, len(live), chunk))
    padding = agree_calls(len(starts)) - len(starts) if agree_calls is not None else 0
    for start in starts:
        idx = live[start : start + chunk]
        w = weight_rows[idx].to(device)
        lp, rr, gg, width = _scored_logp(model, rows, idx, w, logprob_chunk_size, entropy)
        calls += 1
        tokens += int(len(idx) * width)
        sample = rows.sample[idx].to(device)
        values.append(lp)
        where.append(torch.stack([rows.draw[idx].to(device)[rr], sample[rr], gg]))
    logp = torch.zeros(d_n, b_n, g_n, dtype=torch.float32, device=device)
    if values:
        pos = torch.cat(where, dim=1)
        logp = logp.index_put((pos[0], pos[1], pos[2]), torch.cat(values))
    for _ in range(padding):  # the forwards other ranks make (see agree_calls): their gradient is 0
        ids = torch.full((1, 1), model.mask_token_id, dtype=torch.long, device=device)
        logp = logp + model(ids).logits.float().sum() * 0.0
    return TokenScores(
        logp=logp, weight=weight, forwards=len(live), forward_tokens=tokens, calls=calls,
        info={k: v.to(device) for k, v in rows.info.items()},
    )
