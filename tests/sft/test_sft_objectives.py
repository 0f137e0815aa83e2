"""SFT objectives against hand-computed numbers on a table model (logits fixed per input token)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import EOS, MASK, P_MASK, logp

from dllm_rl.estimators import ScoringBatch, TokenScores, plan_block
from dllm_rl.sft.data import SFTExample, collate
from dllm_rl.sft.objectives import compute_objective, sequence_loss

L = math.log


def batch_of(*pairs, step_maps=None) -> ScoringBatch:
    exs = [SFTExample(list(p), list(r), None if step_maps is None else list(step_maps[i]))
           for i, (p, r) in enumerate(pairs)]
    return collate(exs, pad_token_id=EOS)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_sequence_loss_reduction_by_hand():
    logp_ = torch.tensor([[[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]], [[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]]])
    weight = torch.tensor([[[2.0, 0.0, 2.0], [1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    scores = TokenScores(logp=logp_, weight=weight, forwards=4)
    # row 0: draws give (2*1 + 2*0.5)/3 = 1.0 and 1/3 -> mean 2/3; row 1: 3/1 and 0 -> 1.5; batch mean 13/12
    assert sequence_loss(scores, torch.tensor([3, 1])).item() == pytest.approx(13 / 12, abs=1e-6)


def test_random_mask_all_masked_by_hand(table_model):
    b = batch_of(([3, 4], [1, 2, EOS]), ([5], [0, EOS]))
    out = compute_objective("random_mask", table_model("llada"), b, gen(), mask_ratio=1.0)
    row0 = -(L(0.2) + L(0.1) + L(0.05)) / 3
    row1 = -(L(0.4) + L(0.05)) / 2
    assert out.loss.item() == pytest.approx((row0 + row1) / 2, abs=1e-5)
    assert out.scored_tokens == 5


def test_random_mask_dream_reads_the_shifted_logit(table_model):
    # Dream: response token 0 is scored from the raw logits of the last prompt token (4), the rest from masks.
    b = batch_of(([3, 4], [1, 2, EOS]))
    out = compute_objective("random_mask", table_model("dream"), b, gen(), mask_ratio=1.0)
    assert logp(4, 1) == pytest.approx(L(0.05))
    assert out.loss.item() == pytest.approx(-(L(0.05) + L(0.1) + L(0.05)) / 3, abs=1e-5)


def test_random_mask_weight_is_one_over_t(table_model):
    b = batch_of(([3, 4], [1, 2, 0, 3, 1, 2, EOS]))
    targets = [1, 2, 0, 3, 1, 2, EOS]
    model = table_model("llada")
    checked = 0
    for seed in range(10):
        out = compute_objective("random_mask", model, b, gen(seed), eps=1e-3)
        t = out.scores.info["mask_ratio"][0, 0].item()
        assert 1e-3 <= t <= 1.0
        w = out.scores.weight[0, 0]
        masked = w != 0
        assert torch.allclose(w[masked], torch.full_like(w[masked], 1 / t))
        hand = sum((1 / t) * -L(P_MASK[y]) for y, m in zip(targets, masked.tolist()) if m) / 7
        assert out.loss.item() == pytest.approx(hand, rel=1e-5, abs=1e-7)
        checked += int(masked.sum().item() >= 2)
    assert checked >= 3


def test_block_two_stream_all_masked_by_hand(table_model):
    # prompt of 3 tokens, block 4: response token 0 shares block 0 with the prompt.
    b = batch_of(([3, 4, 5], [1, 2, 0, 3, EOS]))
    out = compute_objective("block", table_model("sdar"), b, gen(), mask_ratio=1.0)
    hand = -(L(0.2) + L(0.1) + L(0.4) + L(0.1) + L(0.05)) / 5
    assert out.loss.item() == pytest.approx(hand, abs=1e-5)
    assert tuple(out.scores.info["mask_ratio"].shape) == (1, 2)  # one noise level per block


def test_block_two_stream_one_noise_level_per_block(table_model):
    targets = [1, 2, 0, 3, 1, 2, 0, EOS]
    b = batch_of(([3, 4, 5, 0], targets))  # prompt fills block 0; response = blocks 1 and 2
    out = compute_objective("block", table_model("sdar"), b, gen(5), eps=1e-3)
    t = out.scores.info["mask_ratio"][0]  # [n_blocks]: block 0 holds no response token
    w = out.scores.weight[0, 0]
    block = torch.tensor([1, 1, 1, 1, 2, 2, 2, 2])
    hand = 0.0
    for g, y in enumerate(targets):
        if w[g] != 0:
            assert w[g].item() == pytest.approx(1 / t[block[g]].item(), rel=1e-6)
            hand += w[g].item() * -L(P_MASK[y])
    assert t[1].item() != t[2].item()
    assert out.loss.item() == pytest.approx(hand / 8, rel=1e-5)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_block_sliced_form_by_hand(table_model, family):
    prompt, targets = [3, 4], [1, 2, 0, 3, EOS]  # block 2 -> blocks [1,2] [0,3] [eos]: n_b = 3
    model = table_model(family)
    seen = set()
    for seed in range(12):
        b = batch_of((prompt, targets))
        out = compute_objective("block", model, b, gen(seed), block_size=2, mask_ratio=1.0)
        k = int(out.scores.info["block"][0])
        seen.add(k)
        cols = [g for g in range(5) if g // 2 == k]
        hand = 0.0
        for g in cols:
            if family == "dream" and g == cols[0]:
                prev = prompt[-1] if g == 0 else targets[g - 1]  # clean token before the block
                hand += -logp(prev, targets[g])
            else:
                hand += -L(P_MASK[targets[g]])
        assert out.loss.item() == pytest.approx(3 * hand / 5, abs=1e-5)
    assert seen == {0, 1, 2}


def test_block_sliced_masks_later_blocks_and_keeps_earlier_clean(table_model):
    b = batch_of(([3, 4], [1, 2, 0, 3, EOS]))
    model = table_model("llada")
    for seed in range(8):
        rows = plan_block(model, b, gen(seed), block_size=2, mask_ratio=1.0)
        k = int(rows.info["block"][0])
        resp = rows.input_ids[0, 2:].tolist()
        want = [y if g // 2 < k else MASK for g, y in enumerate([1, 2, 0, 3, EOS])]
        assert resp == want
        assert rows.input_ids[0, :2].tolist() == [3, 4]  # prompt never masked


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_ar_by_hand(table_model, family):
    # token at column c is predicted from the token at c-1 (causal), whatever the family's shift.
    b = batch_of(([3, 4], [1, 2, EOS]))
    out = compute_objective("ar", table_model(family), b, None)
    assert logp(4, 1) == pytest.approx(L(0.05)) and logp(1, 2) == pytest.approx(L(0.4))
    assert logp(2, EOS) == pytest.approx(L(0.1))
    assert out.loss.item() == pytest.approx(-(L(0.05) + L(0.4) + L(0.1)) / 3, abs=1e-5)


def test_ar_is_causal():
    from dllm_rl.models import build_model, tiny_config

    model = build_model("llada", tiny_config("llada", vocab_size=16, hidden_size=32), seed=0)
    b1 = batch_of(([3, 4], [1, 2, 5]))
    b2 = batch_of(([3, 4], [1, 2, 9]))  # only the last token differs: earlier scores must not move
    s1 = compute_objective("ar", model, b1, None).scores.logp[0, 0]
    s2 = compute_objective("ar", model, b2, None).scores.logp[0, 0]
    assert torch.allclose(s1[:2], s2[:2], atol=1e-6)
    assert not torch.allclose(s1[2], s2[2])


def test_ar_refuses_block_models(table_model):
    with pytest.raises(ValueError, match="full-attention"):
        compute_objective("ar", table_model("sdar"), batch_of(([3], [1, EOS])), None)


def test_trace_by_hand(table_model):
    # step map [1, 0, 1]: step 0 commits token 1 (all masked before it); step 1 commits tokens 0 and 2.
    b = batch_of(([3, 4], [1, 2, EOS]), step_maps=[[1, 0, 1]])
    llada = compute_objective("trace", table_model("llada"), b, gen(), shrinkage=1)
    assert llada.loss.item() == pytest.approx(-(L(0.1) + L(0.2) + L(0.05)) / 3, abs=1e-5)
    # Dream reads position g from the raw logits at g-1: token 1 (step 0) from a mask -> P[2] = 0.1;
    # token 0 (step 1) from the prompt's last token 4; token 2 (step 1) from the committed token 2.
    dream = compute_objective("trace", table_model("dream"), b, gen(), shrinkage=1)
    hand = -(L(P_MASK[2]) + logp(4, 1) + logp(2, EOS)) / 3
    assert hand == pytest.approx(-(L(0.1) + L(0.05) + L(0.1)) / 3)
    assert dream.loss.item() == pytest.approx(hand, abs=1e-5)


def test_trace_needs_step_maps(table_model):
    with pytest.raises(ValueError, match="step map"):
        compute_objective("trace", table_model("llada"), batch_of(([3], [1, EOS])), gen())


def test_unknown_objective(table_model):
    with pytest.raises(ValueError, match="random_mask"):
        compute_objective("nope", table_model("llada"), batch_of(([3], [1, EOS])), gen())


def test_prompt_is_never_masked_or_scored(table_model):
    b = batch_of(([3, 4, 5], [1, EOS]))
    out = compute_objective("random_mask", table_model("llada"), b, gen(), mask_ratio=1.0)
    assert out.scores.weight.shape[-1] == 2  # only completion columns are scored
    assert MASK not in b.prompt_ids.tolist()[0]


def test_a_batch_with_nothing_masked_still_back_propagates(table_model):
    model = table_model("llada")
    b = batch_of(([3, 4], [1, EOS]))
    out = compute_objective("random_mask", model, b, gen(), mask_ratio=0.0)
    assert out.scored_tokens == 0 and out.loss.item() == 0.0
    out.loss.backward()  # a forward ran (DDP ranks stay in step); gradients are zero
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_the_nothing_masked_fallback_projects_one_column_per_row(table_model):
    model = table_model("llada")
    b = batch_of(([3, 4], [1, EOS, EOS]), ([5, 6], [2, 1, EOS]))
    shapes = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape[:-1])))
    try:
        out = compute_objective("random_mask", model, b, gen(), mask_ratio=0.0)
    finally:
        handle.remove()
    assert out.scored_tokens == 0 and out.loss.requires_grad
    assert shapes == [(2, 1)]  # not [B, T, V]


def test_objective_config_passes_the_chunk_size_to_every_objective():
    from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE
    from dllm_rl.sft.objectives import OBJECTIVES, ObjectiveConfig

    for name in OBJECTIVES:
        assert ObjectiveConfig(name=name).options()["logprob_chunk_size"] == DEFAULT_CHUNK_SIZE == 128
        assert ObjectiveConfig(name=name, logprob_chunk_size=0).options()["logprob_chunk_size"] == 0
    with pytest.raises(ValueError, match=r"logprob_chunk_size: must be >= 0, got -4"):
        ObjectiveConfig(logprob_chunk_size=-4)
