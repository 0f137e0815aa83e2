"""``DiffusionLM.forward(logits_to_keep=...)``: kept logits equal the full forward's at those positions."""

import pytest
import torch

from dllm_rl.models import attention_bias, build_model, position_ids_from_valid, tiny_config
from dllm_rl.sampling.kv_cache import BufferCache

FAMILIES = ["llada", "dream", "sdar"]


def _model(family):
    return build_model(family, tiny_config(family, vocab_size=64, hidden_size=32, num_layers=2), seed=0)


def _left_padded(model):
    g = torch.Generator().manual_seed(3)
    lengths = (10, 7, 4)  # rows 1 and 2 are left-padded; row 2's first real token is column 6
    ids = torch.full((3, 10), model.pad_token_id)
    valid = torch.zeros(3, 10, dtype=torch.bool)
    for b, n in enumerate(lengths):
        ids[b, 10 - n :] = torch.randint(0, 60, (n,), generator=g)
        valid[b, 10 - n :] = True
    return ids, valid


def _lm_head_rows(model):
    """Number of positions per row each lm_head call projected (a forward hook's record)."""
    seen = []
    handle = model.hf_model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    return seen, handle


@pytest.mark.parametrize("family", FAMILIES)
def test_kept_logits_equal_full_logits(family):
    model = _model(family)
    ids, valid = _left_padded(model)
    with torch.no_grad():
        full = model(ids, attention_mask=valid)
        cases = {
            3: [7, 8, 9],
            5: [5, 6, 7, 8, 9],  # row 2 starts at column 6: it reads its own raw logits there
            10: list(range(10)),
            1: [9],
            torch.tensor([2, 3, 4]): [2, 3, 4],
            torch.tensor([0, 5, 6, 9]): [0, 5, 6, 9],  # 0 and 6: rows whose first real token is there
            torch.tensor([6]): [6],
        }
        for keep, cols in cases.items():
            out = model(ids, attention_mask=valid, logits_to_keep=keep)
            assert out.logits.shape == (3, len(cols), 64)
            torch.testing.assert_close(out.logits, full.logits[:, cols], atol=1e-6, rtol=0)
            torch.testing.assert_close(out.last_raw_logits, full.last_raw_logits, atol=1e-6, rtol=0)
        # 0 / None keep everything and give exactly today's result.
        for keep in (0, None):
            assert torch.equal(model(ids, attention_mask=valid, logits_to_keep=keep).logits, full.logits)


def test_dream_kept_logits_read_the_right_raw_positions():
    model = _model("dream")
    ids, valid = _left_padded(model)
    with torch.no_grad():
        raw = model.hf_model(input_ids=ids, attention_mask=model.default_bias(valid, position_ids_from_valid(valid)),
                             position_ids=position_ids_from_valid(valid)).logits
        out = model(ids, attention_mask=valid, logits_to_keep=torch.tensor([6, 7]))
    # Row 0: column 6 is scored by the raw logits at 5; row 2 starts at column 6 and reads its own.
    torch.testing.assert_close(out.logits[0, 0], raw[0, 5], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits[2, 0], raw[2, 6], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits[2, 1], raw[2, 6], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_lm_head_sees_only_the_needed_positions(family):
    model = _model(family)
    ids, valid = _left_padded(model)
    seen, handle = _lm_head_rows(model)
    try:
        with torch.no_grad():
            model(ids, attention_mask=valid, logits_to_keep=3)
            model(ids, attention_mask=valid, logits_to_keep=torch.tensor([2, 3, 4]))
            model(ids, attention_mask=valid)
    finally:
        handle.remove()
    # Dream also needs raw i - 1 of each kept i; every family adds the last position (``last_raw_logits``).
    assert seen == ([4, 5, 10] if family == "dream" else [3, 4, 10]), seen


def _cached_chunks(model, ids, q0, keep):
    """Forward ``ids[:, :q0]`` into a KV cache, then ``ids[:, q0:]`` against it (Dream: with prev_raw)."""
    bsz, width = ids.shape
    valid = torch.ones_like(ids, dtype=torch.bool)
    pos = position_ids_from_valid(valid)
    if model.is_block_causal:
        from dllm_rl.models import block_index

        blk = block_index(pos, model.block_size)
        bias = attention_bias(valid, query_block=blk, key_block=blk)
    else:
        bias = attention_bias(valid)
    cache = BufferCache()
    first = model(ids[:, :q0], attn_bias=bias[:, :, :q0, :q0], position_ids=pos[:, :q0], past_key_values=cache,
                  use_cache=True)
    out = model(ids[:, q0:], attn_bias=bias[:, :, q0:, :], position_ids=pos[:, q0:], past_key_values=cache,
                use_cache=True, prev_raw_logits=first.last_raw_logits, logits_to_keep=keep)
    return out, first.last_raw_logits


@pytest.mark.parametrize("family", FAMILIES)
def test_kept_logits_with_a_kv_cache(family):
    model = _model(family)
    ids = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full, prev_raw = _cached_chunks(model, ids, 8, None)  # 4 query columns 8..11
        if model.is_block_causal:  # block-causal: the cached chunk is exactly the uncached forward
            torch.testing.assert_close(full.logits, model(ids).logits[:, 8:], atol=1e-5, rtol=0)
        if model.family.shift:  # Dream: chunk column 0 is scored by the previous chunk's last raw logits
            assert torch.equal(full.logits[:, :1], prev_raw)
        for keep, cols in ((2, [2, 3]), (3, [1, 2, 3]), (torch.tensor([0, 1]), [0, 1]), (torch.tensor([0]), [0]),
                           (torch.tensor([1, 3]), [1, 3])):
            out, _ = _cached_chunks(model, ids, 8, keep)
            torch.testing.assert_close(out.logits, full.logits[:, cols], atol=1e-6, rtol=0)
            torch.testing.assert_close(out.last_raw_logits, full.last_raw_logits, atol=1e-6, rtol=0)


def test_dream_column_zero_without_prev_raw_reads_its_own_raw_logits():
    model = _model("dream")
    ids = torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(7))
    valid = torch.ones_like(ids, dtype=torch.bool)
    pos = position_ids_from_valid(valid)
    with torch.no_grad():
        full = model(ids, attn_bias=attention_bias(valid), position_ids=pos)  # no valid: pure shift
        out = model(ids, attn_bias=attention_bias(valid), position_ids=pos, logits_to_keep=torch.tensor([0, 1, 4]))
    torch.testing.assert_close(out.logits, full.logits[:, [0, 1, 4]], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits[:, 0], out.logits[:, 1], atol=1e-6, rtol=0)  # both raw column 0


def test_gradients_flow_through_kept_logits():
    model = _model("dream")
    ids, valid = _left_padded(model)
    model(ids, attention_mask=valid, logits_to_keep=2).logits.float().logsumexp(-1).sum().backward()
    assert model.hf_model.lm_head.weight.grad is not None
    assert model.hf_model.lm_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, torch.zeros(2, 2, dtype=torch.long), torch.tensor([0.0, 1.0])])
def test_bad_logits_to_keep_is_rejected(bad):
    model = _model("llada")
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(torch.zeros(1, 4, dtype=torch.long), logits_to_keep=bad)
