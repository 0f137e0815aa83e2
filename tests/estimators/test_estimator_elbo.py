"""ESPO's ELBO estimator is unbiased: Monte-Carlo mean vs the exact ELBO by enumerating all mask sets."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import EOS, MASK, blockwise_logp, gen

from dllm_rl.estimators import ScoringBatch, estimate


def _sample(length: int, pad: int) -> ScoringBatch:
    """One sample: prompt of 3, an answer of ``length`` counted tokens (last = EOS) and ``pad`` EOS padding."""
    g = gen(100 + length)
    comp = torch.randint(0, EOS, (1, length + pad), generator=g)
    comp[0, length - 1 :] = EOS
    mask = torch.zeros(1, length + pad, dtype=torch.bool)
    mask[0, :length] = True
    return ScoringBatch(torch.randint(0, EOS, (1, 3), generator=g), torch.ones(1, 3, dtype=torch.bool), comp, mask)


def exact_elbo(model, batch: ScoringBatch) -> float:
    """E_{n~U{1..L}} (L/n) E_{|S|=n} sum_{i in S} log p(y_i | y with S masked), by enumerating every S."""
    counted = torch.nonzero(batch.completion_mask[0]).flatten().tolist()
    big_l = len(counted)
    subsets = [c for n in range(1, big_l + 1) for c in itertools.combinations(counted, n)]
    ids = batch.input_ids().expand(len(subsets), -1).clone()
    p = batch.prompt_len
    for r, subset in enumerate(subsets):
        ids[r, [p + i for i in subset]] = MASK
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool)).logits[:, p:].float()
    lp = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids.expand(len(subsets), -1)[..., None])[..., 0]
    total = 0.0
    for n in range(1, big_l + 1):
        sums = [float(lp[r, list(s)].sum()) for r, s in enumerate(subsets) if len(s) == n]
        total += (big_l / n) * sum(sums) / len(sums)
    return total / big_l


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("is_coupled", [False, True])
@pytest.mark.parametrize("num_mc", [1, 2])
def test_elbo_is_unbiased(models, family, is_coupled, num_mc):
    model = models[family]
    one = _sample(length=5, pad=2)
    exact = exact_elbo(model, one)
    reps = 4000 // num_mc  # 4000 draws in all, each replica an independent estimate
    batch = one.select(torch.zeros(reps, dtype=torch.long))
    with torch.no_grad():
        est = estimate(model, "elbo", batch, gen(1), num_mc=num_mc, coupled=is_coupled, max_rows=2048)
        est = est.sequence_score().double()
    mean, se = est.mean().item(), (est.std() / reps**0.5).item()
    assert abs(mean - exact) < 3 * se, (mean, exact, se)
    # the test has teeth: a biased variant (complement without the n = L correction) is detectably off
    assert se < abs(exact) / (2 * 5) / 3


def test_elbo_exact_for_one_token_and_full_length(models):
    """L = 1: n = 1 always, the estimate is exact (log p of the single masked token), in every draw."""
    model = models["llada"]
    one = _sample(length=1, pad=3)
    est = estimate(model, "elbo", one, gen(0), num_mc=4, coupled=True)
    assert torch.all(est.info["num_masked"] == 1)
    torch.testing.assert_close(est.sequence_score()[0].item(), exact_elbo(model, one), atol=1e-5, rtol=0)
    assert est.forwards == 4  # no complement rows when n = L


def exact_block_elbo(model, batch: ScoringBatch) -> float:
    """Block models: the sum over blocks of each block's exact ELBO given clean earlier blocks, every mask
    set of every block enumerated and scored block by block (:func:`conftest.blockwise_logp`)."""
    p = batch.prompt_len
    p_real = int(batch.prompt_mask[0].sum())
    counted = torch.nonzero(batch.completion_mask[0]).flatten().tolist()
    blocks: dict[int, list[int]] = {}
    for i in counted:
        blocks.setdefault((p_real + i) // 4, []).append(i)
    total = 0.0
    for members in blocks.values():
        big_l = len(members)
        for n in range(1, big_l + 1):
            sums = []
            for subset in itertools.combinations(members, n):
                row = batch.input_ids()[0].clone()
                row[[p + i for i in subset]] = MASK
                lp = blockwise_logp(model, row[None], batch.valid(), p, batch.completion_ids)
                sums.append(float(lp[list(subset)].sum()))
            total += (big_l / n) * sum(sums) / len(sums) / big_l
    return total


@pytest.mark.parametrize("is_coupled", [False, True])
def test_block_elbo_is_unbiased(models, is_coupled):
    """SDAR-shaped model: 5 counted tokens over two blocks (1 + 4); the per-block MC estimate averages to the
    exact sum of per-block ELBOs."""
    model = models["sdar"]
    one = _sample(length=5, pad=2)  # prompt of 3: completion positions 3 | 4..7 | 8..9
    exact = exact_block_elbo(model, one)
    reps = 2000
    batch = one.select(torch.zeros(reps, dtype=torch.long))
    with torch.no_grad():
        est = estimate(model, "elbo", batch, gen(2), num_mc=2, coupled=is_coupled, max_rows=2048)
        est = est.sequence_score().double()
    mean, se = est.mean().item(), (est.std() / reps**0.5).item()
    assert abs(mean - exact) < 3 * se, (mean, exact, se)
    assert se < abs(exact) / 30
    # the single-stream value (later blocks seeing masked earlier ones) is a different number
    assert abs(exact_elbo(model, one) - exact) > 6 * se
