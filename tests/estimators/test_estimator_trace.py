"""The trace estimator: exact per-step states on a known step map, shrinkage, the block two-stream path."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import EOS, MASK, Spy, direct_logp, gen

from dllm_rl.estimators import ScoringBatch, estimate, estimator_forwards
from dllm_rl.models import block_index, position_ids_from_valid

M = MASK


def _known_batch() -> ScoringBatch:
    """One sample, P=3, G=6. Steps [0, 2, 1, 3, 3, 5]; the answer is the first 5 tokens (the 5th is EOS),
    the 6th is EOS padding (uncounted)."""
    prompt = torch.tensor([[10, 11, 12]])
    comp = torch.tensor([[20, 21, 22, 23, EOS, EOS]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    steps = torch.tensor([[0, 2, 1, 3, 3, 5]])
    return ScoringBatch(prompt, torch.ones(1, 3, dtype=torch.bool), comp, mask, steps)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_trace_s1_exact_states(models, family):
    model, batch = models[family], _known_batch()
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), shrinkage=1)
    p = [10, 11, 12]
    want = torch.tensor([
        p + [M, M, M, M, M, EOS],         # before step 0: every counted token masked; scores token 0
        p + [20, M, M, M, M, EOS],        # before step 1: scores token 2
        p + [20, M, 22, M, M, EOS],       # before step 2: scores token 1
        p + [20, 21, 22, M, M, EOS],      # before step 3: scores tokens 3 and 4
    ])                                    # step 5 commits only the uncounted padding: no row
    assert torch.equal(spy.inputs(), want)
    assert sc.forwards == 4 and sc.num_draws == 1
    assert torch.equal(sc.weight[0, 0], torch.tensor([1.0, 1, 1, 1, 1, 0]))
    hand = direct_logp(model, want, torch.ones_like(want, dtype=torch.bool), 3, batch.completion_ids.expand(4, -1))
    scored_by = [0, 2, 1, 3, 3]  # row that scores each counted token
    for g, r in enumerate(scored_by):
        torch.testing.assert_close(sc.logp[0, 0, g], hand[r, g], atol=1e-5, rtol=0)
    assert sc.logp[0, 0, 5] == 0
    torch.testing.assert_close(sc.sequence_score()[0], sum(hand[r, g] for g, r in enumerate(scored_by)), atol=1e-5,
                               rtol=0)


def test_trace_shrinkage_merges_steps(models):
    model, batch = models["llada"], _known_batch()
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), shrinkage=2)
    p = [10, 11, 12]
    # merged steps = step // 2 = [0, 1, 0, 1, 1, 2]
    want = torch.tensor([
        p + [M, M, M, M, M, EOS],       # merged step 0 scores tokens 0 and 2
        p + [20, M, 22, M, M, EOS],     # merged step 1 scores tokens 1, 3, 4
    ])
    assert torch.equal(spy.inputs(), want)
    hand = direct_logp(model, want, torch.ones_like(want, dtype=torch.bool), 3, batch.completion_ids.expand(2, -1))
    for g, r in enumerate([0, 1, 0, 1, 1]):
        torch.testing.assert_close(sc.logp[0, 0, g], hand[r, g], atol=1e-5, rtol=0)
    assert estimate(model, "trace", batch, gen(0), shrinkage=6).forwards == 1


def test_trace_mask_uncounted_and_never_committed(models):
    model = models["llada"]
    batch = _known_batch()
    with Spy(model) as spy:
        estimate(model, "trace", batch, gen(0), shrinkage=2, mask_uncounted=True)
    # the padding (step 5) is masked in both states since it is committed after them
    assert torch.equal(spy.inputs()[:, -1], torch.tensor([M, M]))
    # a counted token that was never committed (step -1) is neither masked nor scored
    batch.step_map[0, 1] = -1
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), shrinkage=1)
    assert (spy.inputs()[:, 4] == 21).all()
    assert sc.weight[0, 0, 1] == 0 and sc.logp[0, 0, 1] == 0
    assert sc.forwards == 3  # steps 0, 1, 3


# ------------------------------------------------------------------------------------------- block models
def _block_batch(prompt_lens, g_n=12, tokens_per_step=1, seed=0, answer_lens=None) -> ScoringBatch:
    """A block-sampler-like trace (block size 4): blocks decoded left to right, ``tokens_per_step`` tokens
    committed per step in a random order inside each block; global step counter across blocks."""
    g = gen(seed)
    b_n, p = len(prompt_lens), max(prompt_lens)
    prompt = torch.full((b_n, p), EOS)
    pmask = torch.zeros(b_n, p, dtype=torch.bool)
    for b, n in enumerate(prompt_lens):
        prompt[b, p - n :] = torch.randint(0, EOS, (n,), generator=g)
        pmask[b, p - n :] = True
    comp = torch.randint(0, EOS, (b_n, g_n), generator=g)
    cmask = torch.ones(b_n, g_n, dtype=torch.bool)
    valid = torch.cat([pmask, torch.ones(b_n, g_n, dtype=torch.bool)], 1)
    blk = block_index(position_ids_from_valid(valid), 4)[:, p:]
    steps = torch.full((b_n, g_n), -1)
    for b in range(b_n):
        step = 0
        for j in blk[b].unique().tolist():
            cols = torch.nonzero(blk[b] == j).flatten()
            cols = cols[torch.randperm(len(cols), generator=g)]
            for k in range(0, len(cols), tokens_per_step):
                steps[b, cols[k : k + tokens_per_step]] = step
                step += 1
        if answer_lens is not None:
            a = answer_lens[b]
            cmask[b, a:] = False
            comp[b, a - 1 :] = EOS
            # blocks after the one holding the EOS are never generated
            last_blk = blk[b, a - 1]
            steps[b, blk[b] > last_blk] = -1
    return ScoringBatch(prompt, pmask, comp, cmask, steps)


def _per_step_by_hand(model, batch, s):
    """Direct single-stream forwards: for each block j and merged local step r, the state the block
    sampler saw (earlier blocks clean, block j with local step // s >= r masked, later blocks masked)."""
    p, g_n = batch.prompt_len, batch.completion_len
    valid = batch.valid()
    blk = block_index(position_ids_from_valid(valid), 4)[:, p:]
    logp = torch.zeros(1, batch.batch_size, g_n)
    rows = 0
    for b in range(batch.batch_size):
        step = batch.step_map[b]
        for j in blk[b].unique().tolist():
            in_j = (blk[b] == j) & (step >= 0)
            if not in_j.any():
                continue
            local = torch.where(in_j, step - step[in_j].min(), -1)
            merged = torch.where(in_j, torch.div(local, s, rounding_mode="floor"), -1)
            for r in sorted(set(merged[in_j & batch.completion_mask[b]].tolist())):
                ids = batch.input_ids()[b].clone()
                comp = ids[p:]
                comp[(blk[b] > j) & (step >= 0) & batch.completion_mask[b]] = MASK
                comp[in_j & (merged >= r) & batch.completion_mask[b]] = MASK
                lp = direct_logp(model, ids[None], valid[b][None], p, batch.completion_ids[b][None])[0]
                scored = in_j & (merged == r) & batch.completion_mask[b]
                logp[0, b][scored] = lp[scored]
                rows += 1
    return logp, rows


@pytest.mark.parametrize("s", [1, 2, 3])
@pytest.mark.parametrize("prompt_lens", [[8, 8], [6, 5]], ids=["aligned", "unaligned"])
def test_two_stream_equals_per_step_direct_forwards(models, s, prompt_lens):
    model = models["sdar"]
    batch = _block_batch(prompt_lens)
    sc = estimate(model, "trace", batch, gen(0), shrinkage=s)
    hand, rows = _per_step_by_hand(model, batch, s)
    torch.testing.assert_close(sc.logp, hand, atol=1e-5, rtol=0)
    assert torch.equal(sc.weight[0], batch.completion_mask.float())
    # the full-attention-style path (one block-causal row per (block, merged step)) agrees too
    plain = estimate(model, "trace", batch, gen(0), shrinkage=s, layout="per_step")
    torch.testing.assert_close(plain.logp, sc.logp, atol=1e-5, rtol=0)
    assert plain.forwards == rows
    assert sc.forwards < plain.forwards


@pytest.mark.parametrize("s", [1, 2, 3, 4])
@pytest.mark.parametrize("tokens_per_step", [1, 2])
def test_two_stream_cost(models, s, tokens_per_step):
    """Block models: ceil(steps_per_block / s) forwards of length prompt + 2 x response per sample."""
    model = models["sdar"]
    batch = _block_batch([8, 8], g_n=12, tokens_per_step=tokens_per_step)
    steps_per_block = 4 // tokens_per_step
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), shrinkage=s)
    per_sample = math.ceil(steps_per_block / s)
    assert sc.forwards == 2 * per_sample
    assert estimator_forwards(model, "trace", batch, shrinkage=s) == sc.forwards
    assert spy.inputs().shape == (2 * per_sample, 8 + 2 * 12)
    assert sc.forward_tokens == sc.forwards * (8 + 2 * 12)
    assert sc.calls == 1
    chunked = estimate(model, "trace", batch, gen(0), shrinkage=s, max_rows=1)
    assert chunked.calls == sc.forwards
    torch.testing.assert_close(chunked.logp, sc.logp, atol=1e-5, rtol=0)


def test_two_stream_noisy_copy_states(models):
    """Spy on the two-stream input: the noisy copy of each block is its state before merged step r."""
    model = models["sdar"]
    batch = _block_batch([8], g_n=8)
    with Spy(model) as spy:
        estimate(model, "trace", batch, gen(0), shrinkage=1)
    ids = spy.inputs()
    clean = batch.input_ids()[0]
    step = batch.step_map[0]
    local = step - torch.cat([step[:4].min().expand(4), step[4:].min().expand(4)])
    assert ids.shape == (4, 8 + 16)
    for r in range(4):
        assert torch.equal(ids[r, :16], clean)  # [prompt | clean response]
        noisy = torch.where(local >= r, M, batch.completion_ids[0])
        assert torch.equal(ids[r, 16:], noisy)


def test_block_trace_with_early_eos_and_ungenerated_blocks(models):
    model = models["sdar"]
    batch = _block_batch([8, 7], g_n=16, answer_lens=[6, 10], seed=3)
    sc = estimate(model, "trace", batch, gen(0))
    hand, _ = _per_step_by_hand(model, batch, 1)
    torch.testing.assert_close(sc.logp, hand, atol=1e-5, rtol=0)
    assert torch.equal(sc.weight[0], batch.completion_mask.float())


def test_trace_errors(models):
    batch = _known_batch()
    batch.step_map = None
    with pytest.raises(ValueError, match="step_map"):
        estimate(models["llada"], "trace", batch, gen(0))
    with pytest.raises(ValueError, match="two_stream"):
        estimate(models["llada"], "trace", _known_batch(), gen(0), layout="two_stream")
    with pytest.raises(ValueError, match="shrinkage"):
        estimate(models["llada"], "trace", _known_batch(), gen(0), shrinkage=0)
