"""Hand-computed values: every estimator's masks, weights and log-probs against direct forwards.

The random estimators draw ``torch.rand((B, D))`` then ``torch.rand((B, D, ...))`` from the caller's
generator (documented in each planner); the tests redraw those numbers by hand, derive the masks from the
paper formulas, and compare them with what the model was actually fed (a forward pre-hook spy).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import EOS, FAMILIES, MASK, Spy, blockwise_logp, direct_logp, fed_rows, gen, make_batch

from dllm_rl.estimators import (
    estimate,
    estimator_forwards,
    plan_coupled,
    plan_elbo,
    plan_mean_field,
    plan_random_mask,
)
from dllm_rl.models import full_bias, position_ids_from_valid


def _rows_by_hand(batch, masked_rows):
    """Inputs built by hand: clean sequence of the row's sample with ``masked`` completion columns masked."""
    ids = []
    for b, m in masked_rows:
        row = batch.input_ids()[b].clone()
        row[batch.prompt_len :][m] = MASK
        ids.append(row)
    return torch.stack(ids)


def _hand_logp(model, row, valid, prompt_len, targets):
    """Direct forwards of one masked row ``[P + G]``: one plain forward, or block by block for block models."""
    if model.is_block_causal:
        return blockwise_logp(model, row[None], valid[None], prompt_len, targets[None])
    return direct_logp(model, row[None], valid[None], prompt_len, targets[None])[0]


def _check_logp(model, batch, scores, d, b, m, atol=1e-5):
    """``logp[d, b]`` at the tokens ``m`` equals direct forwards of the sample with exactly ``m`` masked."""
    row = batch.input_ids()[b].clone()
    row[batch.prompt_len :][m] = MASK
    hand = _hand_logp(model, row, batch.valid()[b], batch.prompt_len, batch.completion_ids[b])
    torch.testing.assert_close(scores.logp[d, b][m], hand[m], atol=atol, rtol=0)


# --------------------------------------------------------------------------------------------- elbo
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("is_coupled", [False, True])
def test_elbo_masks_weights_and_logp_by_hand(models, family, is_coupled):
    model, batch, d_n = models[family], make_batch(), 3
    with Spy(model) as spy:
        sc = estimate(model, "elbo", batch, gen(7), num_mc=d_n, coupled=is_coupled)
    # Redraw the estimator's random numbers by hand.
    g = gen(7)
    b_n, g_n = batch.batch_size, batch.completion_len
    offset = torch.rand((b_n, d_n), generator=g)
    keys = torch.rand((b_n, d_n, g_n), generator=g)
    expected_rows, expected_w = [], torch.zeros(d_n, b_n, g_n)
    second_rows, sets = [], []
    for d in range(d_n):
        for b in range(b_n):
            counted = batch.completion_mask[b]
            big_l = int(counted.sum())
            u = (d + float(offset[b, d])) / d_n
            n = min(math.floor(u * big_l) + 1, big_l)
            assert sc.info["num_masked"][d, b] == n
            # stratum d of [0, 1): n lies between the stratum's ends
            assert math.floor(d / d_n * big_l) + 1 <= n <= min(math.floor((d + 1) / d_n * big_l) + 1, big_l)
            order = sorted(torch.nonzero(counted).flatten().tolist(), key=lambda i: float(keys[b, d, i]))
            s = torch.zeros(g_n, dtype=torch.bool)
            s[order[:n]] = True
            comp = counted & ~s
            expected_rows.append((b, s))
            sets.append((d, b, s))
            if is_coupled:
                if n == big_l:
                    expected_w[d, b][s] = 1.0
                else:
                    expected_w[d, b][s] = big_l / (2 * n)
                    expected_w[d, b][comp] = big_l / (2 * (big_l - n))
                    second_rows.append((b, comp))
                    sets.append((d, b, comp))
            else:
                expected_w[d, b][s] = big_l / n
    want = _rows_by_hand(batch, [m for m in expected_rows] + second_rows)
    assert torch.equal(spy.inputs(), want)
    torch.testing.assert_close(sc.weight, expected_w, atol=0, rtol=1e-6)
    for d, b, m in sets:
        _check_logp(model, batch, sc, d, b, m)
    assert torch.all(sc.logp[sc.weight == 0] == 0)
    for d in range(d_n):
        for b in range(b_n):
            if is_coupled:  # every counted token scored exactly once per coupled draw
                assert torch.equal(sc.weight[d, b] != 0, batch.completion_mask[b])
    # The uncounted EOS padding and the prompt are never masked.
    ids = spy.inputs()
    assert not (ids[:, : batch.prompt_len] == MASK).any()
    assert sc.forwards == len(want)
    by_hand = (expected_w * sc.logp).sum(-1).mean(0)
    torch.testing.assert_close(sc.sequence_score(), by_hand)


@pytest.mark.parametrize("is_coupled", [False, True])
def test_elbo_block_model_draws_noise_per_block_by_hand(models, is_coupled):
    """Block models: each block of the completion is its own ELBO segment (n_j ~ U{1..L_j} stratified, weight
    L_j / n_j, complement per block), scored in the two-stream layout against clean earlier blocks."""
    model, batch, d_n = models["sdar"], make_batch(), 2
    with Spy(model) as spy:
        sc = estimate(model, "elbo", batch, gen(7), num_mc=d_n, coupled=is_coupled)
    planned = plan_elbo(model, batch, gen(7), num_mc=d_n, coupled=is_coupled)
    g = gen(7)
    b_n, g_n = batch.batch_size, batch.completion_len
    s_n = (4 + g_n - 2) // 4 + 1  # segments a completion of G tokens can touch (block size 4)
    offset = torch.rand((b_n, d_n, s_n), generator=g)
    keys = torch.rand((b_n, d_n, g_n), generator=g)
    rows, second, expected_w = [], [], torch.zeros(d_n, b_n, g_n)
    for d in range(d_n):
        for b in range(b_n):
            p_real = int(batch.prompt_mask[b].sum())
            seg = torch.tensor([(p_real + i) // 4 - p_real // 4 for i in range(g_n)])
            s_set = torch.zeros(g_n, dtype=torch.bool)
            comp = torch.zeros(g_n, dtype=torch.bool)
            total_n = 0
            for j in range(s_n):
                members = [i for i in range(g_n) if seg[i] == j and batch.completion_mask[b, i]]
                big_l = len(members)
                if big_l == 0:
                    continue
                n = min(math.floor((d + float(offset[b, d, j])) / d_n * big_l) + 1, big_l)
                total_n += n
                chosen = sorted(members, key=lambda i: float(keys[b, d, i]))[:n]
                rest = [i for i in members if i not in chosen]
                s_set[chosen] = True
                comp[rest] = True
                if not is_coupled:
                    expected_w[d, b, chosen] = big_l / n
                elif n == big_l:
                    expected_w[d, b, chosen] = 1.0
                else:
                    expected_w[d, b, chosen] = big_l / (2 * n)
                    expected_w[d, b, rest] = big_l / (2 * (big_l - n))
            assert sc.info["num_masked"][d, b] == total_n
            rows.append((b, s_set))
            if is_coupled and comp.any():
                second.append((b, comp))
    assert torch.equal(fed_rows(model, spy, planned), _rows_by_hand(batch, rows + second))
    torch.testing.assert_close(sc.weight, expected_w, atol=0, rtol=1e-6)
    assert planned.num_rows == len(rows) + len(second)
    for d in range(d_n):
        for b in range(b_n):
            chosen = rows[d * b_n + b][1]
            _check_logp(model, batch, sc, d, b, chosen)
            if is_coupled:
                assert torch.equal(sc.weight[d, b] != 0, batch.completion_mask[b])  # each token once per draw
                comp = batch.completion_mask[b] & ~chosen
                if comp.any():
                    _check_logp(model, batch, sc, d, b, comp)


def test_elbo_zero_length_rows_score_zero(models):
    model = models["llada"]
    batch = make_batch()
    batch.completion_mask[1] = False
    with Spy(model) as spy:
        sc = estimate(model, "elbo", batch, gen(0), num_mc=2)
    assert sc.sequence_score()[1] == 0
    assert torch.all(sc.weight[:, 1] == 0)
    rows = plan_elbo(model, batch, gen(0), num_mc=2)
    assert 1 not in rows.sample.tolist()  # no forward for the empty answer
    assert sc.forwards == spy.inputs().shape[0] == rows.num_rows


# --------------------------------------------------------------------------------------------- mean_field
@pytest.mark.parametrize("family", FAMILIES)
def test_mean_field_by_hand(models, family):
    model, batch = models[family], make_batch()
    with Spy(model) as spy:
        sc = estimate(model, "mean_field", batch, gen(5), p_mask_prompt=0.4)
    g = gen(5)
    prompt_draw = torch.rand((batch.batch_size, 1, batch.prompt_len), generator=g)[:, 0] < 0.4
    want = batch.input_ids().clone()
    p = batch.prompt_len
    want[:, :p][prompt_draw & batch.prompt_mask] = MASK
    want[:, p:][batch.completion_mask] = MASK
    assert torch.equal(fed_rows(model, spy, plan_mean_field(model, batch, gen(5), p_mask_prompt=0.4)), want)
    assert (want[:, :p] == MASK).any(), "the seed should mask at least one prompt token"
    assert torch.equal(sc.weight[0], batch.completion_mask.float())
    hand = torch.stack([_hand_logp(model, want[b], batch.valid()[b], p, batch.completion_ids[b])
                        for b in range(batch.batch_size)])
    torch.testing.assert_close(sc.logp[0], torch.where(batch.completion_mask, hand, 0.0), atol=1e-5, rtol=0)


def test_mean_field_dream_shift_by_raw_logits(models):
    """Dream's raw logit at i scores token i+1: rebuild the aligned log-probs from the HF module directly."""
    model, batch = models["dream"], make_batch()
    sc = estimate(model, "mean_field", batch, gen(1), p_mask_prompt=0.0)
    ids = batch.input_ids().clone()
    p = batch.prompt_len
    ids[:, p:][batch.completion_mask] = MASK
    valid = batch.valid()
    with torch.no_grad():
        raw = model.model(input_ids=ids, attention_mask=full_bias(valid), position_ids=position_ids_from_valid(valid))
    logits = raw.logits[:, p - 1 : -1].float()  # raw position p+g-1 predicts completion token g
    hand = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(sc.logp[0], torch.where(batch.completion_mask, hand, 0.0), atol=1e-5, rtol=0)


def test_mean_field_prompt_mask_rate(models):
    model = models["llada"]
    g = gen(0)
    b, p = 64, 24
    from dllm_rl.estimators import ScoringBatch, plan_mean_field

    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    prompt_mask[:, :4] = False  # padding is never masked
    batch = ScoringBatch(torch.randint(0, EOS, (b, p), generator=g), prompt_mask,
                         torch.randint(0, EOS, (b, 4), generator=g), torch.ones(b, 4, dtype=torch.bool))
    rows = plan_mean_field(model, batch, gen(1))
    masked = rows.input_ids[:, :p] == MASK
    assert not masked[:, :4].any()
    rate = masked[:, 4:].float().mean().item()
    assert abs(rate - 0.15) < 0.03  # 1280 tokens: sd 0.01


# --------------------------------------------------------------------------------------------- random_mask
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("importance_weight", [False, True])
def test_random_mask_by_hand(models, family, importance_weight):
    model, batch = models[family], make_batch()
    lo, hi, d_n = 0.3, 0.9, 2
    with Spy(model) as spy:
        sc = estimate(model, "random_mask", batch, gen(11), lo=lo, hi=hi, importance_weight=importance_weight,
                      num_mc=d_n)
    g = gen(11)
    b_n, g_n = batch.batch_size, batch.completion_len
    t = lo + (hi - lo) * torch.rand((b_n, d_n), generator=g)
    r = torch.rand((b_n, d_n, g_n), generator=g)
    rows, w = [], torch.zeros(d_n, b_n, g_n)
    for d in range(d_n):
        for b in range(b_n):
            m = (r[b, d] < t[b, d]) & batch.completion_mask[b]
            if m.any():
                rows.append((b, m))
            w[d, b][m] = 1.0 / t[b, d] if importance_weight else 1.0
    planned = plan_random_mask(model, batch, gen(11), lo=lo, hi=hi, importance_weight=importance_weight, num_mc=d_n)
    assert torch.equal(fed_rows(model, spy, planned), _rows_by_hand(batch, rows))
    torch.testing.assert_close(sc.info["mask_ratio"], t.t())
    torch.testing.assert_close(sc.weight, w)
    for d in range(d_n):
        for b in range(b_n):
            _check_logp(model, batch, sc, d, b, w[d, b] != 0)


def test_random_mask_pinned_ratio_and_rate(models):
    from dllm_rl.estimators import ScoringBatch, plan_random_mask

    g = gen(0)
    b, n = 200, 10
    batch = ScoringBatch(torch.randint(0, EOS, (b, 3), generator=g), torch.ones(b, 3, dtype=torch.bool),
                         torch.randint(0, EOS, (b, n), generator=g), torch.ones(b, n, dtype=torch.bool))
    rows = plan_random_mask(models["llada"], batch, gen(2), mask_ratio=0.25)
    assert torch.all(rows.info["mask_ratio"] == 0.25)
    rate = (rows.input_ids[:, 3:] == MASK).sum().item() / (b * n)
    assert abs(rate - 0.25) < 0.04  # 2000 tokens: sd 0.0097 (rows masking nothing are dropped: P=0.056)


# --------------------------------------------------------------------------------------------- coupled
@pytest.mark.parametrize("family", FAMILIES)
def test_coupled_by_hand(models, family):
    model, batch = models[family], make_batch()
    with Spy(model) as spy:
        sc = estimate(model, "coupled", batch, gen(13), full_mask_row=True)
    g = gen(13)
    b_n, g_n = batch.batch_size, batch.completion_len
    t = 0.2 + 0.6 * torch.rand((b_n, 1), generator=g)
    r = torch.rand((b_n, 1, g_n), generator=g)
    first = [(b, (r[b, 0] < t[b, 0]) & batch.completion_mask[b]) for b in range(b_n)]
    second = [(b, (r[b, 0] >= t[b, 0]) & batch.completion_mask[b]) for b in range(b_n)]
    full = [(b, batch.completion_mask[b]) for b in range(b_n)]
    expected = [x for x in first + second + full if x[1].any()]
    planned = plan_coupled(model, batch, gen(13), full_mask_row=True)
    assert torch.equal(fed_rows(model, spy, planned), _rows_by_hand(batch, expected))
    assert sc.num_draws == 2
    for b in range(b_n):
        w = torch.zeros(g_n)
        w[first[b][1]] = 1.0 / t[b, 0]
        w[second[b][1]] = 1.0 / (1.0 - t[b, 0])
        torch.testing.assert_close(sc.weight[0, b], w)
        assert torch.equal(sc.weight[0, b] != 0, batch.completion_mask[b])  # each counted token exactly once
        assert torch.equal(sc.weight[1, b], batch.completion_mask[b].float())
        for mask_set in (first[b][1], second[b][1]):
            row = batch.input_ids()[b].clone()
            row[batch.prompt_len :][mask_set] = MASK
            hand = _hand_logp(model, row, batch.valid()[b], batch.prompt_len, batch.completion_ids[b])
            torch.testing.assert_close(sc.logp[0, b][mask_set], hand[mask_set], atol=1e-5, rtol=0)
        _check_logp(model, batch, sc, 1, b, batch.completion_mask[b])
    # DiffuCoder's per-token estimate (logp_full + w * logp_pair) / 2 is token_score().
    want = (sc.logp[1] * sc.weight[1] + sc.weight[0] * sc.logp[0]) / 2
    torch.testing.assert_close(sc.token_score(), want)


def test_coupled_unweighted_pair_sums_each_token_once(models):
    model, batch = models["llada"], make_batch()
    sc = estimate(model, "coupled", batch, gen(3), importance_weight=False, num_mc=2)
    assert torch.equal(sc.weight, batch.completion_mask.float()[None].expand(2, -1, -1))
    # 2 rows per sample and draw, minus rows that mask nothing (the other row then masks every token)
    assert 2 * 2 * batch.batch_size - 1 == sc.forwards
    assert estimator_forwards(model, "coupled", batch, gen(3), importance_weight=False, num_mc=2) == sc.forwards
