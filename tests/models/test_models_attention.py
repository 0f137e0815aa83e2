import pytest
import torch

from dllm_rl.models import (
    attention_bias,
    block_causal_bias,
    block_index,
    build_model,
    position_ids_from_valid,
    tiny_config,
    two_stream_layout,
)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_full_attention_every_token_influences_every_position(family):
    model = build_model(family, tiny_config(family), seed=0)
    x = torch.randint(0, 60, (1, 8))
    base = model(x).logits
    for j in range(8):
        y = x.clone()
        y[0, j] = (y[0, j] + 1) % 60
        diff = (model(y).logits - base).abs().amax(-1)[0]
        others = [i for i in range(8) if i != j]
        assert (diff[others] > 1e-6).all(), f"changing token {j} left some positions unchanged: {diff}"


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_left_padded_batch_equals_each_sequence_alone(family, attn):
    model = build_model(family, tiny_config(family), seed=0, attn_implementation=attn)
    seqs = [torch.randint(0, 60, (n,)) for n in (9, 5, 2)]
    T = max(len(s) for s in seqs)
    ids = torch.full((3, T), model.pad_token_id)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, T - len(s):] = s
        mask[i, T - len(s):] = 1
    batched = model(ids, attention_mask=mask).logits
    for i, s in enumerate(seqs):
        alone = model(s[None]).logits[0]
        torch.testing.assert_close(batched[i, T - len(s):], alone, atol=1e-5, rtol=0)


def test_block_causal_blocks_do_not_see_the_future_and_see_their_own_block():
    model = build_model("sdar", tiny_config("sdar", block_size=4), seed=0)
    x = torch.randint(0, 60, (1, 12))  # blocks [0-3] [4-7] [8-11]
    base = model(x).logits
    # Change a token in block 2: blocks 0 and 1 unchanged.
    y = x.clone()
    y[0, 9] = (y[0, 9] + 3) % 60
    out = model(y).logits
    torch.testing.assert_close(out[:, :8], base[:, :8], atol=0, rtol=0)
    # Change a token in block 1: every position of block 1 changes (bidirectional inside the block).
    z = x.clone()
    z[0, 6] = (z[0, 6] + 3) % 60
    diff = (model(z).logits - base).abs().amax(-1)[0]
    assert (diff[4:8] > 1e-6).all() and (diff[:4] == 0).all()


def test_block_boundaries_count_real_tokens_from_the_sequence_start():
    valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    pos = position_ids_from_valid(valid)
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3, 4, 5]]
    assert block_index(pos, 4).tolist() == [[0, 0, 0, 0, 0, 0, 1, 1]]
    bias = block_causal_bias(valid, 4)
    allowed = (bias[0, 0] == 0).int()
    # Column 6 (position 4, block 1) sees all real tokens; column 3 (block 0) sees block 0 only; pads never.
    assert allowed[6].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert allowed[3].tolist() == [0, 0, 1, 1, 1, 1, 0, 0]


def test_masks_are_additive_floats_not_booleans():
    bias = block_causal_bias(torch.ones(1, 4, dtype=torch.bool), 2, dtype=torch.bfloat16)
    assert bias.dtype == torch.bfloat16
    assert bias.shape == (1, 1, 4, 4)
    assert set(bias.unique().tolist()) == {0.0, torch.finfo(torch.bfloat16).min}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("prompt_lens", [(6, 6), (8, 5), (3, 7)])
def test_two_stream_noisy_blocks_equal_direct_forwards(attn, prompt_lens):
    bs, R = 4, 10
    model = build_model("sdar", tiny_config("sdar", block_size=bs), seed=5, attn_implementation=attn)
    g = torch.Generator().manual_seed(0)
    rows = []
    for P in prompt_lens:
        prompt = torch.randint(0, 60, (P,), generator=g)
        resp = torch.randint(0, 60, (R,), generator=g)
        noisy = resp.clone()
        noisy[torch.rand(R, generator=g) < 0.5] = model.mask_token_id
        rows.append((prompt, resp, noisy))
    T = max(prompt_lens) + R
    clean = torch.full((len(rows), T), model.pad_token_id)
    noisy_ids = clean.clone()
    valid = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (p, r, n) in enumerate(rows):
        off = T - len(p) - R
        clean[i, off:] = torch.cat([p, r])
        noisy_ids[i, off:] = torch.cat([p, n])
        valid[i, off:] = True
    layout = two_stream_layout(clean, noisy_ids, valid, torch.tensor(prompt_lens), bs, model.pad_token_id)
    out = layout.noisy_logits(model(layout.input_ids, attn_bias=layout.bias, position_ids=layout.position_ids).logits)

    checked = 0
    for i, (p, r, n) in enumerate(rows):
        P, off = len(p), T - len(p) - R
        for j in range(P // bs, (P + R - 1) // bs + 1):  # every block holding a response token
            lo, hi = j * bs, min((j + 1) * bs, P + R)
            seq = torch.cat([p, r])[:lo]
            blk = torch.cat([p, n])[lo:hi]
            direct = model(torch.cat([seq, blk])[None]).logits[0, lo:hi]
            torch.testing.assert_close(out[i, off + max(lo, P): off + hi], direct[max(lo, P) - lo:], atol=1e-5, rtol=0)
            checked += 1
    assert checked >= 6


def test_attention_bias_rules_for_cached_queries():
    # Queries are the last block only, keys are the whole sequence (a KV-cached forward).
    valid = torch.ones(1, 8, dtype=torch.bool)
    blk = block_index(position_ids_from_valid(valid), 4)
    bias = attention_bias(valid, query_block=blk[:, 4:], key_block=blk)
    assert bias.shape == (1, 1, 4, 8)
    assert (bias == 0).all()
    bias = attention_bias(valid, query_block=blk[:, :4], key_block=blk)
    assert ((bias[0, 0] == 0).int().sum(-1) == 4).all()


def test_dream_logits_are_the_raw_logits_shifted_by_one():
    model = build_model("dream", tiny_config("dream"), seed=0)
    x = torch.randint(0, 60, (2, 7))
    # Stock HF forward with an all-zero additive mask (bidirectional): raw[:, i] scores token i+1.
    raw = model.model(input_ids=x, attention_mask=torch.zeros(2, 1, 7, 7)).logits
    out = model(x)
    torch.testing.assert_close(out.logits[:, 1:], raw[:, :-1], atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logits[:, 0], raw[:, 0], atol=1e-6, rtol=0)
    prev = torch.randn(2, 1, raw.shape[-1])
    torch.testing.assert_close(model.align_logits(raw, prev)[:, 0], prev[:, 0])
