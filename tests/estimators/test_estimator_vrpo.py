"""VRPO's stratified ELBO (LLaDA 1.5, arXiv 2505.19223): the counts of a given offset, the rows' masks and
weights, shared masks for identically seeded calls, per-block counts on block models, and unbiasedness."""

from __future__ import annotations

import torch
from conftest import MASK, gen
from test_estimator_elbo import _sample, exact_elbo

from dllm_rl.estimators import ScoringBatch, estimate, plan_rows
from dllm_rl.estimators.vrpo import stratified_counts


def test_stratified_counts_of_a_given_offset():
    ten = torch.tensor([10])
    # L = 10, n = 4: v = k + j * 2.5, rounded half to even, wrapped into [1, 10]
    assert stratified_counts(torch.tensor([5]), ten, 4).tolist() == [[5, 8, 10, 2]]
    assert stratified_counts(torch.tensor([3]), ten, 4).tolist() == [[3, 6, 8, 10]]  # 5.5 -> 6, 10.5 -> 10
    assert stratified_counts(torch.tensor([1]), ten, 4).tolist() == [[1, 4, 6, 8]]  # 3.5 -> 4, 8.5 -> 8
    assert stratified_counts(torch.tensor([10]), ten, 4).tolist() == [[10, 2, 5, 8]]  # 12.5 -> 12 -> 2
    assert stratified_counts(torch.tensor([2]), torch.tensor([3]), 2).tolist() == [[2, 1]]  # 3.5 -> 4 -> wraps to 1
    assert stratified_counts(torch.tensor([1, 0]), torch.tensor([1, 0]), 3).tolist() == [[1, 1, 1], [0, 0, 0]]


def test_rows_mask_the_counts_with_weight_l_over_x(models):
    model = models["llada"]
    one = _sample(length=10, pad=2)
    batch = one.select(torch.zeros(6, dtype=torch.long))
    rows = plan_rows(model, "vrpo", batch, gen(3), num_mc=4)
    k, length = rows.info["offset"][:, 0], batch.lengths
    assert length.tolist() == [10] * 6
    want = stratified_counts(k, length, 4)  # [B, 4]
    assert rows.num_rows == 24  # every row masks at least one token
    p = batch.prompt_len
    for r in range(rows.num_rows):
        b, d = int(rows.sample[r]), int(rows.draw[r])
        masked = rows.input_ids[r, p:] == MASK
        x = int(want[b, d])
        assert int(masked.sum()) == x
        assert not masked[10:].any()  # uncounted EOS padding stays clean
        assert torch.equal(rows.input_ids[r, :p], batch.prompt_ids[b])  # the prompt is never masked
        assert torch.equal(rows.weight[r], masked.float() * (10 / x))
    assert len(set(k.tolist())) > 1  # the offsets differ between samples


def test_identically_seeded_calls_mask_alike_and_own_seeds_independently(models):
    model = models["llada"]
    one = _sample(length=10, pad=0)
    batch = one.select(torch.zeros(2, dtype=torch.long))
    batch.sample_seeds = torch.tensor([7, 8])
    a = plan_rows(model, "vrpo", batch, gen(5), num_mc=3)
    b = plan_rows(model, "vrpo", batch, gen(5), num_mc=3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.weight, b.weight)  # policy and reference
    same_text = a.input_ids[a.sample == 0], a.input_ids[a.sample == 1]
    assert not torch.equal(*same_text)  # one text, two seeds: independent masks


def test_block_models_draw_a_comb_per_block(models):
    model = models["sdar"]  # block size 4
    g = gen(11)
    comp = torch.randint(0, 60, (1, 12), generator=g)
    batch = ScoringBatch(torch.randint(0, 60, (1, 4), generator=g), torch.ones(1, 4, dtype=torch.bool), comp,
                         torch.ones(1, 12, dtype=torch.bool))
    rows = plan_rows(model, "vrpo", batch, gen(2), num_mc=2)
    k = rows.info["offset"][0]  # [S]: one offset per block
    p = batch.prompt_len
    for r in range(rows.num_rows):
        masked = rows.input_ids[r, p:] == MASK
        for j in range(3):
            x = int(stratified_counts(k[j:j + 1], torch.tensor([4]), 2)[0, int(rows.draw[r])])
            assert int(masked[4 * j:4 * j + 4].sum()) == x
            assert torch.allclose(rows.weight[r, 4 * j:4 * j + 4], masked[4 * j:4 * j + 4].float() * 4 / x)
    assert rows.clean_ids is not None  # two-stream layout


def test_vrpo_elbo_is_unbiased(models):
    model = models["dream"]
    one = _sample(length=5, pad=2)
    exact = exact_elbo(model, one)
    reps = 1000
    with torch.no_grad():
        est = estimate(model, "vrpo", one.select(torch.zeros(reps, dtype=torch.long)), gen(1), num_mc=4,
                       max_rows=2048).sequence_score().double()
    mean, se = est.mean().item(), (est.std() / reps**0.5).item()
    assert abs(mean - exact) < 3 * se, (mean, exact, se)
    assert se < abs(exact) / 30
