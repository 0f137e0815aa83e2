"""The estimators of the new methods against hand computations: JustGRPO's left-to-right likelihood and SPG's
block-wise ELBO / EUBO, whose exact values (enumeration, L <= 6) sandwich the exact log-likelihood."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import EOS, MASK, blockwise_logp, direct_logp, gen
from test_estimator_elbo import _sample, exact_elbo

from dllm_rl.estimators import ScoringBatch, estimate, estimator_forwards
from dllm_rl.rl.methods.spg import eubo_scores


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_left_to_right_scores_each_token_with_the_future_masked(models, family):
    model = models[family]
    one = _sample(length=4, pad=2)  # 4 counted tokens, then 2 EOS padding columns
    p, g_n = one.prompt_len, one.completion_len
    want = torch.zeros(g_n)
    for i in range(4):
        ids = one.input_ids().clone()
        ids[0, p + i :] = MASK  # token i and every later column masked, earlier ones clean
        want[i] = direct_logp(model, ids, one.valid(), p, one.completion_ids)[0, i]
    with torch.no_grad():
        got = estimate(model, "left_to_right", one, None)
    assert torch.allclose(got.logp[0, 0], want, atol=1e-5)
    assert got.weight[0, 0].tolist() == [1, 1, 1, 1, 0, 0]
    assert got.forwards == 4 and estimator_forwards(model, "left_to_right", one) == 4
    with torch.no_grad():  # not the causal-mask AR estimator
        ar = estimate(model, "ar", one, None).logp[0, 0, :4]
    assert not torch.allclose(ar, want[:4], atol=1e-3)


def test_left_to_right_on_a_block_model_packs_offsets_into_block_size_rows(models):
    model = models["sdar"]  # block 4; prompt of 3 (tail 3), completion of 9: blocks hold 1 + 4 + 4 tokens
    g = gen(7)
    comp = torch.randint(0, EOS, (1, 9), generator=g)
    one = ScoringBatch(torch.randint(0, EOS, (1, 3), generator=g), torch.ones(1, 3, dtype=torch.bool), comp,
                       torch.ones(1, 9, dtype=torch.bool))
    p = one.prompt_len
    pos = torch.arange(p + 9)
    want = torch.zeros(9)
    for j in range(4):  # in-block offset j: offsets >= j masked in every block (each block sees clean earlier ones)
        noisy = one.input_ids().clone()
        noisy[0, (pos >= p) & (pos % 4 >= j)] = MASK
        lp = blockwise_logp(model, noisy, one.valid(), p, one.completion_ids)
        at_j = (pos[p:] % 4) == j
        want[at_j] = lp[at_j]
    with torch.no_grad():
        got = estimate(model, "left_to_right", one, None)
    assert torch.allclose(got.logp[0, 0], want, atol=1e-5)
    assert got.forwards == 4


def exact_loglik(model, batch: ScoringBatch) -> float:
    """``log p(y)`` of the sampler that unmasks one uniformly random token per step (the any-order likelihood
    ``log E_sigma prod_k p(y_sigma_k | y_sigma_<k)``), by dynamic programming over the 2^L unmasked sets."""
    counted = torch.nonzero(batch.completion_mask[0]).flatten().tolist()
    p = batch.prompt_len
    states = [frozenset(c) for n in range(len(counted)) for c in itertools.combinations(counted, n)]
    ids = batch.input_ids().expand(len(states), -1).clone()
    for r, clean in enumerate(states):
        ids[r, [p + i for i in counted if i not in clean]] = MASK
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool)).logits[:, p:].float()
    prob = torch.softmax(logits, -1).gather(-1, batch.completion_ids.expand(len(states), -1)[..., None])[..., 0]
    row = {s: r for r, s in enumerate(states)}
    f = {frozenset(counted): 1.0}
    for clean in sorted(states, key=len, reverse=True):
        todo = [i for i in counted if i not in clean]
        f[clean] = sum(float(prob[row[clean], i]) * f[clean | {i}] for i in todo) / len(todo)
    return math.log(f[frozenset()])


def exact_eubo(model, batch: ScoringBatch, beta: float) -> float:
    """SPG's EUBO at infinitely many draws for the one-block (``n ~ U{1..L}``) masking, by enumeration:
    ``a_i = (1/L) sum_n mean_{|S| = n, i in S} p_i(S)^beta`` and EUBO ``= L mean_i (1/beta) log a_i``."""
    counted = torch.nonzero(batch.completion_mask[0]).flatten().tolist()
    big_l, p = len(counted), batch.prompt_len
    subsets = [c for n in range(1, big_l + 1) for c in itertools.combinations(counted, n)]
    ids = batch.input_ids().expand(len(subsets), -1).clone()
    for r, s in enumerate(subsets):
        ids[r, [p + i for i in s]] = MASK
    lp = direct_logp(model, ids, torch.ones_like(ids, dtype=torch.bool), p, batch.completion_ids.expand(len(ids), -1))
    terms = []
    for i in counted:
        a = 0.0
        for n in range(1, big_l + 1):
            vals = [math.exp(beta * float(lp[r, i])) for r, s in enumerate(subsets) if len(s) == n and i in s]
            a += sum(vals) / len(vals) / big_l
        terms.append(math.log(a) / beta)
    return big_l * sum(terms) / big_l


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("length", [2, 3, 4, 5, 6])
def test_spg_bounds_sandwich_the_exact_loglik(models, family, length):
    """ELBO < log p < EUBO at SPG's beta 1.5 and 2. The EUBO is derived for a model whose conditionals are those
    of one joint distribution; a random tiny model's are not, and at beta = 1 its EUBO can fall below log p
    (llada, L = 3: -13.512 < -13.488), so only the EUBO's growth in beta is asserted there."""
    model = models[family]
    one = _sample(length=length, pad=0)
    loglik = exact_loglik(model, one)
    lower = exact_elbo(model, one)  # one block: SPG's ELBO is the "exactly n masked" ELBO
    uppers = [exact_eubo(model, one, beta) for beta in (1.0, 1.5, 2.0)]
    assert lower < loglik < uppers[1] < uppers[2], (lower, loglik, uppers)
    assert lower < uppers[0] < uppers[1]


def test_spg_block_estimates_converge_to_the_exact_bounds(models):
    model = models["llada"]
    one = _sample(length=4, pad=0)
    with torch.no_grad():
        est = estimate(model, "spg_block", one, gen(3), num_mc=3000, max_rows=1024)
    elbo = float(est.sequence_score()[0])
    eubo = float(eubo_scores(est, one.lengths, 1.5)[0])
    assert abs(elbo - exact_elbo(model, one)) < 0.05 * abs(exact_elbo(model, one))
    assert abs(eubo - exact_eubo(model, one, 1.5)) < 0.05 * abs(exact_eubo(model, one, 1.5))


def test_spg_block_masks_one_block_partly_and_every_later_block(models):
    model = models["llada"]
    g = gen(5)  # 10 counted tokens in blocks of 4 (4 + 4 + 2), 2 EOS padding columns (uncounted)
    comp = torch.randint(0, EOS, (1, 12), generator=g)
    comp[0, 9:] = EOS
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[0, :10] = True
    one = ScoringBatch(torch.randint(0, EOS, (1, 3), generator=g), torch.ones(1, 3, dtype=torch.bool), comp, mask)
    from dllm_rl.estimators.registry import ESTIMATORS

    rows = ESTIMATORS["spg_block"](model, one, gen(11), num_mc=6, block_length=4)
    for r in range(rows.num_rows):
        masked = rows.input_ids[r, 3:] == MASK
        k = int(rows.info["block"][rows.draw[r], 0])
        blk = torch.arange(12) // 4
        assert not masked[blk < k].any()  # earlier blocks clean
        in_k = masked[(blk == k) & mask[0]]
        assert 1 <= int(in_k.sum()) <= int(((blk == k) & mask[0]).sum())
        assert masked[(blk > k) & mask[0]].all() and masked[~mask[0]].all()  # later blocks and padding masked
        n = int((masked & mask[0]).sum())
        assert torch.allclose(rows.weight[r], (masked & mask[0]).float() * 10 / n)
