"""EGSPO (arXiv 2603.12554, as its released code does it): the recorded entropy, the step selection on a hand-built
entropy trace, the step rows, and the step-level loss and KL by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.estimators import ESTIMATORS, ScoringBatch, TokenScores
from dllm_rl.estimators.egspo_steps import select_steps
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.losses import LossConfig, policy_objective
from dllm_rl.rl.methods import POLICY_LOSSES
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.confidence import entropies

VOCAB, MASK = 32, 31


def tiny(family: str):
    cfg = tiny_config(family, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    return build_model(family, cfg, seed=0)


def test_entropy_of_the_facts_example_and_of_random_logits():
    inf = float("inf")
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [5.0, -inf, -inf, -inf]]], dtype=torch.float64)
    h = entropies(logits)[0]
    assert h.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-12)
    assert h.mean().item() == pytest.approx(0.693147, abs=1e-6)  # the step's score
    x = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4
    p = torch.softmax(x, -1)
    assert torch.allclose(entropies(x), -(p * torch.log(p)).sum(-1), atol=1e-12)


# one sample, 8 counted tokens then 2 EOS padding (uncounted), 2 tokens per step over steps 0..4:
#   step:     0    0    1    1    2    2    3    3    4    4
#   entropy: 0.2  0.4  1.0  0.0  .75  .25  0.1  0.3  9.0  9.0   (step 4 holds the uncounted padding only)
STEP = torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [1, 0, 2, -1, -1, -1, -1, -1, -1, -1]])
ENTROPY = torch.tensor([[0.2, 0.4, 1.0, 0.0, 0.75, 0.25, 0.1, 0.3, 9.0, 9.0], [0.5, 0.7, 0.0] + [0.0] * 7])
COUNTED = torch.tensor([[True] * 8 + [False] * 2, [True] * 3 + [False] * 7])


def test_top_k_steps_by_the_mean_entropy_of_the_committed_counted_tokens():
    # sample 0: step means 0.3, 0.5, 0.5 (exactly), 0.2 (step 4 is padding): top 3 = 1 and 2 (a tie: the earlier
    # first), 0;
    # sample 1: steps 0 (0.7), 1 (0.5), 2 (0.0) and nothing more
    steps, scores = select_steps(STEP, ENTROPY, COUNTED, 3)
    assert steps.tolist() == [[1, 2, 0], [0, 1, 2]]
    assert scores.flatten().tolist() == pytest.approx([0.5, 0.5, 0.3, 0.7, 0.5, 0.0])
    steps, scores = select_steps(STEP, ENTROPY, COUNTED, 5)
    assert steps.tolist() == [[1, 2, 0, 3, -1], [0, 1, 2, -1, -1]]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_each_draw_is_the_state_before_its_step_scoring_that_step(family):
    g = torch.Generator().manual_seed(0)
    batch = ScoringBatch(torch.randint(0, 28, (2, 2), generator=g), torch.ones(2, 2, dtype=torch.bool),
                         torch.randint(0, 28, (2, 10), generator=g), COUNTED, step_map=STEP, entropy=ENTROPY)
    rows = ESTIMATORS["egspo_steps"](tiny(family), batch, None, num_steps=2)
    assert rows.num_draws == 2 and rows.clean_ids is None  # single-stream rows on both kinds of model
    want = {(0, 0): 1, (1, 0): 2, (0, 1): 0, (1, 1): 1}  # (draw, sample) -> the selected step
    assert sorted(zip(rows.draw.tolist(), rows.sample.tolist())) == sorted(want)
    for r in range(rows.num_rows):
        d, b = int(rows.draw[r]), int(rows.sample[r])
        t = want[(d, b)]
        masked = (rows.input_ids[r, 2:] == MASK).tolist()
        assert masked == [bool(COUNTED[b, i]) and int(STEP[b, i]) >= t for i in range(10)]
        assert rows.weight[r].tolist() == [float(bool(COUNTED[b, i]) and int(STEP[b, i]) == t) for i in range(10)]
    assert rows.info["step"].tolist() == [[1.0, 0.0], [2.0, 1.0]]


def test_without_the_rollout_entropy_the_estimator_says_what_it_needs():
    batch = ScoringBatch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                         torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                         step_map=torch.arange(3)[None])
    with pytest.raises(ValueError, match="egspo_steps estimator needs batch.step_map and batch.entropy"):
        ESTIMATORS["egspo_steps"](tiny("llada"), batch, None)


def test_the_step_loss_by_hand():
    # the facts' example: A = 2/3, step log-prob new -1.0 (two tokens), old -1.5: r = e^0.5 clipped to 1.5 -> -1.0,
    # over 2 tokens per step -> -0.5; a second draw scores nothing and does not count
    new = TokenScores(torch.tensor([[[-0.4, -0.6]], [[0.0, 0.0]]], requires_grad=True),
                      torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]]), 0)
    old = TokenScores(torch.tensor([[[-0.5, -1.0]], [[0.0, 0.0]]]), new.weight, 0)
    cfg = LossConfig(epsilon=0.2, epsilon_high=0.5, options={"tokens_per_step": 2})
    out = POLICY_LOSSES["egspo"](new, old, None, torch.tensor([2 / 3]), torch.tensor([2]), cfg)
    assert out.loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert out.stats["clip_frac"] == 1.0
    # unclipped (A < 0): -(-2/3) e^0.5 / 2, gradient e^0.5 / 3 on each of the step's tokens
    out = POLICY_LOSSES["egspo"](new, old, None, torch.tensor([-2 / 3]), torch.tensor([2]), cfg)
    assert out.loss.item() == pytest.approx(math.exp(0.5) / 3, abs=1e-6)
    out.loss.backward()
    assert new.logp.grad[0, 0].tolist() == pytest.approx([math.exp(0.5) / 3] * 2, abs=1e-6)


def test_the_step_level_kl_by_hand():
    # k3 on the step log-likelihoods: d = ref - new = -2.0 - (-1.0) = -1 -> e^-1 + 1 - 1; one live cell of two
    new = TokenScores(torch.tensor([[[-0.4, -0.6]], [[0.0, 0.0]]]), torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]]), 0)
    ref = TokenScores(torch.tensor([[[-1.5, -0.5]], [[0.0, 0.0]]]), new.weight, 0)
    cfg = LossConfig(beta=0.1, kl_estimator="k3", options={"tokens_per_step": 2})
    out = policy_objective(POLICY_LOSSES["egspo"], new, new, ref, torch.tensor([1.0]), torch.tensor([2]), cfg)
    assert out.stats["kl"] == pytest.approx(math.exp(-1.0), abs=1e-6)
    assert out.loss.item() == pytest.approx(-1.0 / 2 + 0.1 * math.exp(-1.0), abs=1e-6)


def test_the_rollout_records_the_entropy_the_model_had_at_each_commit():
    model = tiny("llada")
    with torch.no_grad():
        model.model.lm_head.weight.mul_(4.0)  # spread the entropies
    prompt = [3, 4, 5]
    roll = generate(model, [prompt], DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, seed=3,
                                                  cache="none"))
    ids, step = roll.completion_ids[0], roll.step_map[0]
    assert (step >= 0).all()
    for t in range(int(step.max()) + 1):  # replay the state before step t: later tokens masked
        state = torch.where(step >= t, torch.full_like(ids, MASK), ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + state.tolist()])).logits[0, 3:].double()
        at = step == t
        assert torch.allclose(roll.entropy[0][at].double(), entropies(logits)[at], atol=1e-5)
    assert len(set(roll.entropy[0].tolist())) > 4
    moved = type(roll).cat([roll, roll.select([0])]).to("cpu")
    assert torch.equal(moved.entropy, torch.cat([roll.entropy, roll.entropy]))
