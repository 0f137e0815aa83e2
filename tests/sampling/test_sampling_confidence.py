"""Token choice, confidence scores and commit selection, with hand-computed numbers."""

import math

import pytest
import torch

from dllm_rl.sampling.confidence import (
    confidence_scores,
    filter_logits,
    sample_tokens,
    select_commits,
    transfer_counts,
)


def _logits(*probs):
    return torch.tensor(probs, dtype=torch.float64).log()[None]  # [1, L, V]


def test_confidence_rules_hand_computed():
    logits = _logits([0.5, 0.3, 0.2], [0.1, 0.1, 0.8])
    tokens = logits.argmax(-1)
    assert tokens.tolist() == [[0, 2]]
    assert confidence_scores("prob", logits, tokens).tolist()[0] == pytest.approx([0.5, 0.8])
    assert confidence_scores("margin", logits, tokens).tolist()[0] == pytest.approx([0.2, 0.7])
    # exp(-H) = prod p^p
    want = [0.5**0.5 * 0.3**0.3 * 0.2**0.2, 0.1**0.1 * 0.1**0.1 * 0.8**0.8]
    assert confidence_scores("entropy", logits, tokens).tolist()[0] == pytest.approx(want)
    assert want[0] == pytest.approx(0.357131, abs=1e-6)
    # a sampled (non-argmax) token gets its own probability
    assert confidence_scores("prob", logits, torch.tensor([[1, 0]])).tolist()[0] == pytest.approx([0.3, 0.1])
    g = torch.Generator().manual_seed(3)
    rnd = confidence_scores("random", logits, tokens, [g])
    assert rnd.tolist() == torch.rand(2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)[None].tolist()


def test_transfer_counts_llada_schedule():
    masked = torch.tensor([10, 2, 8])
    counts = torch.stack([transfer_counts(masked, 4, t) for t in range(4)], dim=1)
    assert counts.tolist() == [[3, 3, 2, 2], [1, 1, 0, 0], [2, 2, 2, 2]]


def test_select_commits_static_dynamic_and_ties():
    conf = torch.tensor([[0.3, 0.9, 0.3, 0.95, 0.99]], dtype=torch.float64)
    cand = torch.tensor([[True, True, True, True, False]])  # the 0.99 slot is not masked
    assert select_commits(conf, cand, counts=torch.tensor([2]))[0].tolist() == [False, True, False, True, False]
    # tie at 0.3 between slots 0 and 2: the lower position goes first
    assert select_commits(conf, cand, counts=torch.tensor([3]))[0].tolist() == [True, True, False, True, False]
    assert select_commits(conf, cand, threshold=0.9)[0].tolist() == [False, False, False, True, False]
    low = torch.tensor([[0.2, 0.1, 0.2, 0.05]], dtype=torch.float64)
    assert select_commits(low, torch.ones(1, 4, dtype=torch.bool), threshold=0.5)[0].tolist() == [
        True, False, False, False]


def test_filter_logits_top_k_top_p():
    logits = _logits([0.5, 0.25, 0.15, 0.1])
    keep = lambda out: torch.isfinite(out)[0, 0].tolist()  # noqa: E731
    assert keep(filter_logits(logits, top_k=2)) == [True, True, False, False]
    assert keep(filter_logits(logits, top_p=0.45)) == [True, False, False, False]
    assert keep(filter_logits(logits, top_p=0.6)) == [True, True, False, False]
    assert keep(filter_logits(logits, top_p=0.85)) == [True, True, True, False]
    assert keep(filter_logits(logits, top_k=3, top_p=0.99)) == [True, True, True, False]


def test_gumbel_max_matches_llada_formula_and_distribution():
    logits = _logits([0.7, 0.2, 0.1]).expand(1, 4000, 3).contiguous()
    temp = 0.7
    toks = sample_tokens(logits, temp, generators=[torch.Generator().manual_seed(0)])
    # LLaDA add_gumbel_noise: argmax exp(l) / (-log u)^T with the same u (float64)
    u = torch.rand((4000, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    llada = (logits[0].exp() / (-torch.log(u)) ** temp).argmax(-1)
    assert torch.equal(toks[0], llada)
    # frequencies follow softmax(l / T)
    want = torch.softmax(logits[0, 0] / temp, -1)
    freq = torch.bincount(toks[0], minlength=3).double() / 4000
    assert torch.allclose(freq, want, atol=0.025)
    assert math.isclose(want[0].item(), 0.7 ** (1 / 0.7) / sum(p ** (1 / 0.7) for p in (0.7, 0.2, 0.1)))
    greedy = sample_tokens(logits, 0.0)
    assert (greedy == 0).all()
    top1 = sample_tokens(logits, 5.0, top_k=1, generators=[torch.Generator().manual_seed(1)])
    assert (top1 == 0).all()
