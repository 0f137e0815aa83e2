"""EBPO (arXiv 2602.08676, as DARE implements it): the block-composite ELBO's masks on enumerated cases, the
sequence-level clipped loss by hand, and the draw-by-draw backward against the all-at-once gradient (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.estimators import ESTIMATORS, ScoringBatch, TokenScores, estimate
from dllm_rl.estimators.ebpo_block import masked_counts, stratified_levels
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.draw_backward import backward_by_draw
from dllm_rl.rl.losses import LossConfig
from dllm_rl.rl.methods import POLICY_LOSSES

VOCAB, MASK = 32, 31


def tiny(family: str, dtype=torch.float32):
    cfg = tiny_config(family, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    return build_model(family, cfg, seed=0, dtype=dtype)


def batch() -> ScoringBatch:
    """2 samples, P = 3 (sample 1 left-padded by 1), G = 8; sample 0 counts 6 tokens, sample 1 all 8."""
    g = torch.Generator().manual_seed(0)
    prompt_mask = torch.tensor([[True, True, True], [False, True, True]])
    comp_mask = torch.ones(2, 8, dtype=torch.bool)
    comp_mask[0, 6:] = False
    return ScoringBatch(torch.randint(0, 28, (2, 3), generator=g), prompt_mask,
                        torch.randint(0, 28, (2, 8), generator=g), comp_mask)


def test_the_facts_worked_example_levels_counts_and_weights():
    # blocks of 2 and 4 counted tokens, 2 draws, u = 0.3: cells (d0 b0, d0 b1, d1 b0, d1 b1)
    length = torch.tensor([[2, 4]])
    t = stratified_levels(torch.tensor([0.3], dtype=torch.float64), length, 2)
    assert t.flatten().tolist() == pytest.approx([0.3, 0.55, 0.8, 0.05], abs=1e-12)
    k = masked_counts(t, length)
    assert k.flatten().tolist() == [1, 3, 2, 1]
    assert (length[:, None, :] / k).flatten().tolist() == pytest.approx([2.0, 4 / 3, 1.0, 4.0])  # 1 / p_mask
    # the composite: draw 0 scores block 0 at -0.4, block 1 at -0.2, -0.3, -0.1; draw 1: -0.2, -0.4 and -0.5
    logp = torch.tensor([[[-0.4, 0, -0.2, -0.3, -0.1, 0]], [[-0.2, -0.4, 0, 0, -0.5, 0]]])
    weight = torch.tensor([[[2.0, 0, 4 / 3, 4 / 3, 4 / 3, 0]], [[1.0, 1.0, 0, 0, 4.0, 0]]])
    assert TokenScores(logp, weight, 0).sequence_score().item() == pytest.approx(-2.1, abs=1e-6)


def test_empty_blocks_take_no_cell_and_mask_nothing():
    length = torch.tensor([[3, 0, 1]])  # the middle block holds no counted token: M = 2 draws x 2 blocks
    t = stratified_levels(torch.tensor([0.9], dtype=torch.float64), length, 2)
    assert t[0, :, [0, 2]].flatten().tolist() == pytest.approx([0.9, 0.15, 0.4, 0.65], abs=1e-12)
    assert masked_counts(t, length)[0].tolist() == [[3, 0, 1], [2, 0, 1]]


# sample 0 (prompt of 3 real tokens): completion positions 3..10, blocks {3} {4..7} {8..10}, 6 counted -> 1, 4, 1;
# sample 1 (2 real): positions 2..9, blocks {2, 3} {4..7} {8, 9} -> 2, 4, 2. Full attention, block_length 4:
# blocks {0..3} {4..7} of the completion -> 4, 2 and 4, 4.
CASES = {"sdar": (None, [[0, 1, 1, 1, 1, 2, 2, 2], [0, 0, 1, 1, 1, 1, 2, 2]]),
         "llada": (4, [[0, 0, 0, 0, 1, 1, 1, 1]] * 2)}


@pytest.mark.parametrize("family", sorted(CASES))
def test_every_block_of_every_draw_masks_its_stratified_count(family):
    block_length, blocks = CASES[family]
    b, d_n = batch(), 3
    rows = ESTIMATORS["ebpo_block"](tiny(family), b, torch.Generator().manual_seed(7), num_mc=d_n,
                                    block_length=block_length)
    u = torch.rand(2, generator=torch.Generator().manual_seed(7))  # the planner's first draw: one u per sample
    seg = torch.tensor(blocks)
    for s in range(2):
        counted = b.completion_mask[s]
        sizes = torch.bincount(seg[s][counted])
        nb = len(sizes)
        # the levels of the sample's D x nb cells are u + j / M, evenly spaced mod 1
        levels = sorted(((u[s].item() + j / (d_n * nb)) % 1.0) for j in range(d_n * nb))
        got_t = stratified_levels(u[s:s + 1], sizes[None], d_n)[0].flatten().sort().values.tolist()
        assert got_t == pytest.approx(levels, abs=1e-7)
        for d in range(d_n):
            (r,) = torch.nonzero((rows.draw == d) & (rows.sample == s), as_tuple=True)[0].tolist()
            comp = rows.input_ids[r, b.prompt_len:]
            masked = comp == MASK
            assert not (masked & ~counted).any()  # uncounted tokens stay clean context
            for blk, size in enumerate(sizes.tolist()):
                in_blk = (seg[s] == blk) & counted
                t = (u[s].item() + (d * nb + blk) / (d_n * nb)) % 1.0
                k = min(math.floor(t * size) + 1, size)
                assert int(masked[in_blk].sum()) == k >= 1
                assert rows.weight[r][in_blk & masked].tolist() == pytest.approx([size / k] * k)
            assert rows.weight[r][~masked].abs().sum() == 0


def test_the_loss_clips_once_in_log_space_by_hand():
    # l_old = -10, l_new = -9.5 (log r = 0.5 > log 1.2) for A = +1 and A = -1; a third sample has no counted token
    new = TokenScores(torch.tensor([[[-9.5], [-9.5], [-3.0]]], requires_grad=True), torch.ones(1, 3, 1), 0)
    old = TokenScores(torch.tensor([[[-10.0], [-10.0], [-3.0]]]), torch.ones(1, 3, 1), 0)
    out = POLICY_LOSSES["ebpo"](new, old, None, torch.tensor([1.0, -1.0, 5.0]), torch.tensor([4, 4, 0]),
                                LossConfig(epsilon=0.2))
    assert out.loss.item() == pytest.approx((-1.2 + math.exp(0.5)) / 2, abs=1e-6)
    out.loss.backward()
    # A > 0 is clipped (no gradient); A < 0 is not: d(e^(l - l_old))/dl / 2 sequences; the empty one counts nothing
    assert new.logp.grad.flatten().tolist() == pytest.approx([0.0, math.exp(0.5) / 2, 0.0], abs=1e-6)
    assert out.stats["clip_frac"] == pytest.approx(1 / 3)
    assert out.stats["ppo_kl"] == pytest.approx(-1 / 3, abs=1e-6)


def test_a_huge_sequence_ratio_is_clipped_without_nan():
    new = TokenScores(torch.tensor([[[-1.0]]], requires_grad=True), torch.ones(1, 1, 1), 0)
    old = TokenScores(torch.tensor([[[-400.0]]]), torch.ones(1, 1, 1), 0)
    out = POLICY_LOSSES["ebpo"](new, old, None, torch.tensor([2.0]), torch.tensor([1]),
                                LossConfig(epsilon=0.2, epsilon_high=0.28))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2.0 * 1.28)
    assert new.logp.grad.item() == 0.0


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_draw_by_draw_backward_is_the_all_at_once_gradient(family):
    model = tiny(family, torch.float64)
    b = batch()
    opts = {"num_mc": 4, "block_length": 4} if family == "llada" else {"num_mc": 4}
    adv = torch.tensor([-1.0, 0.7])
    cfg = LossConfig(epsilon=0.2, epsilon_high=0.28)
    with torch.no_grad():
        old = estimate(model, "ebpo_block", b, torch.Generator().manual_seed(5), **opts)
    with torch.no_grad():  # an off-policy point where sample 0 is clipped and sample 1 is not
        for p in model.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    new = estimate(model, "ebpo_block", b, torch.Generator().manual_seed(5), **opts)
    full = POLICY_LOSSES["ebpo"](new, old, None, adv, b.lengths, cfg)
    log_r = (new.sequence_score() - old.sequence_score()).tolist()
    assert log_r[0] < math.log(0.8) and log_r[1] < math.log(1.28)  # A < 0 clipped on sample 0; sample 1 not
    full.loss.backward()
    want = [p.grad.clone() for p in model.model.parameters()]
    model.model.zero_grad()
    parts = []

    def backward(loss, last):
        parts.append(last)
        loss.backward()

    out, got = backward_by_draw(model, "ebpo_block", b, 5, opts, POLICY_LOSSES["ebpo"], old, None, adv, cfg, 1.0,
                                backward)
    assert parts == [False, False, False, True]  # one backward per draw, the last one marked
    assert out.loss.item() == full.loss.item()
    assert torch.equal(got.logp, new.logp.detach())
    assert any(w.abs().max() > 0 for w in want)
    for p, w in zip(model.model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-12, atol=1e-15)
