"""The new methods' losses, advantage rule and draw-by-draw backward against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.estimators import ScoringBatch, TokenScores, estimate
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.draw_backward import backward_by_draw
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig, policy_objective, sequence_clipped_loss
from dllm_rl.rl.methods.wd1 import wd1_weights


def scores(logp, weight) -> TokenScores:
    return TokenScores(logp=torch.tensor(logp, dtype=torch.float32), weight=torch.tensor(weight), forwards=0)


# D = 2 draws, B = 2 samples, G = 2 tokens; sample 0 has L = 2, sample 1 has L = 1.
LOGP = [[[-1.0, -2.0], [-0.5, 0.0]], [[-1.5, -0.5], [-2.0, 0.0]]]
WEIGHT = [[[2.0, 0.0], [1.0, 0.0]], [[1.0, 1.0], [1.0, 0.0]]]
LENGTHS = torch.tensor([2, 1])


def test_spg_loss_by_hand():
    new = scores(LOGP, WEIGHT)
    adv = torch.tensor([1.0, -0.5])
    # ELBO (sequence_score): sample 0: mean(2 * -1, -1.5 - 0.5) = -2; sample 1: mean(-0.5, -2) = -1.25
    # EUBO (beta 1.5), sample 1: a = mean(1 * e^{-0.75}, 1 * e^{-3}) over its one token; L = 1
    a1 = (math.exp(-0.75) + math.exp(-3.0)) / 2
    eubo1 = math.log(a1) / 1.5
    mix1 = 0.5 * eubo1 + 0.5 * -1.25
    want = -(1.0 * -2.0 + -0.5 * mix1) / 3
    out = POLICY_LOSSES["spg"](new, new, None, adv, LENGTHS, LossConfig())
    assert out.loss.item() == pytest.approx(want, abs=1e-6)
    eubo_only = POLICY_LOSSES["spg"](new, new, None, adv, LENGTHS, LossConfig(options={"mode": "eubo"}))
    assert eubo_only.loss.item() == pytest.approx(-(1.0 * -2.0 + -0.5 * eubo1) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="loss_options: beta not read by the 'spg' loss; valid: mode, eubo_beta"):
        POLICY_LOSSES["spg"](new, new, None, adv, LENGTHS, LossConfig(options={"beta": 2}))
    with pytest.raises(ValueError, match="the 'spg' loss defines no KL term: set beta=0"):
        policy_objective(POLICY_LOSSES["spg"], new, new, None, adv, LENGTHS, LossConfig(beta=0.01))


def test_bgpo_bound_by_hand_and_equivalent_to_espo_on_policy():
    old = scores(LOGP, WEIGHT)
    leaf = torch.tensor(LOGP, requires_grad=True)
    new = TokenScores(logp=leaf, weight=old.weight, forwards=0)
    adv = torch.tensor([1.0, -0.5])
    bgpo = POLICY_LOSSES["bgpo"](new, old, None, adv, LENGTHS, LossConfig())
    assert bgpo.loss.item() == pytest.approx(-(1.0 - 0.5) / 2) and bgpo.stats["ratio_max_dev"] == 0.0
    (g_bgpo,) = torch.autograd.grad(bgpo.loss, leaf)
    espo = sequence_clipped_loss(new, old, None, adv, LENGTHS, LossConfig(epsilon=10.0))
    (g_espo,) = torch.autograd.grad(espo.loss, leaf)
    assert espo.loss.item() == pytest.approx(bgpo.loss.item())
    assert torch.allclose(g_bgpo, g_espo)
    # off-policy: z = per-draw log-ratio / L; the bound lies below the objective (its loss above ESPO's)
    moved = scores([[[-0.5, -2.0], [-0.5, 0.0]], [[-1.5, -0.5], [-1.0, 0.0]]], WEIGHT)
    z0 = [(2 * 0.5) / 2, 0.0]  # sample 0, draws 0 and 1
    z1 = [0.0, 1.0 / 1]  # sample 1
    want = -((1.0 * (1 + sum(z0) / 2)) + (-0.5 * (math.exp(z1[0]) + math.exp(z1[1])) / 2)) / 2
    off = POLICY_LOSSES["bgpo"](moved, old, None, adv, LENGTHS, LossConfig())
    assert off.loss.item() == pytest.approx(want, abs=1e-6)
    assert off.loss.item() > sequence_clipped_loss(moved, old, None, adv, LENGTHS, LossConfig(epsilon=10.0)).loss.item()


def test_wd1_weights_and_loss_by_hand():
    w = wd1_weights(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    a = torch.tensor([0.75, -0.25, -0.25, -0.25])
    assert torch.allclose(w, torch.softmax(a, 0) - torch.softmax(-a, 0))
    e = math.e
    assert w[0].item() == pytest.approx(e / (e + 3) - math.exp(-0.75) / (math.exp(-0.75) + 3 * math.exp(0.25)))
    new = scores(LOGP, WEIGHT)
    out = POLICY_LOSSES["weighted_loglik"](new, new, None, torch.tensor([0.3, -0.3]), LENGTHS, LossConfig())
    assert out.loss.item() == pytest.approx(-(0.3 * -2.0 + -0.3 * -1.25) / 2)


def test_draw_by_draw_backward_gives_the_full_gradient():
    cfg = tiny_config("llada", vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32)
    model = build_model("llada", cfg, seed=0)
    g = torch.Generator().manual_seed(0)
    batch = ScoringBatch(torch.randint(0, 28, (3, 3), generator=g), torch.ones(3, 3, dtype=torch.bool),
                         torch.randint(0, 28, (3, 5), generator=g), torch.ones(3, 5, dtype=torch.bool))
    adv = torch.tensor([1.0, -1.0, 0.5])
    opts = {"num_mc": 4, "coupled": False}
    with torch.no_grad():
        old = estimate(model, "elbo", batch, torch.Generator().manual_seed(5), **opts)
    for p in model.model.parameters():  # an off-policy point: the bound's per-draw terms differ from ESPO's
        p.data.add_(0.01)
    new = estimate(model, "elbo", batch, torch.Generator().manual_seed(5), **opts)
    full = POLICY_LOSSES["bgpo"](new, old, None, adv, batch.lengths, LossConfig())
    full.loss.backward()
    want = [p.grad.clone() for p in model.model.parameters()]
    model.model.zero_grad()
    out, got_new = backward_by_draw(model, "elbo", batch, 5, opts, POLICY_LOSSES["bgpo"], old, None, adv,
                                    LossConfig(), 1.0, lambda loss, last: loss.backward())
    assert out.loss.item() == pytest.approx(full.loss.item(), abs=1e-6)
    assert torch.allclose(got_new.logp, new.logp.detach(), atol=1e-6)
    for p, w in zip(model.model.parameters(), want):
        assert torch.allclose(p.grad, w, atol=1e-6)


def test_beta_on_a_loss_without_kl_is_a_config_error():
    from dllm_rl.config import ConfigError, load_config
    from dllm_rl.rl.algorithms import resolve
    from dllm_rl.rl.config import RLConfig

    cfg = load_config(RLConfig, None, ["model.path=m", "algorithm=spg", "beta=0.01"])
    with pytest.raises(ConfigError, match="beta: the 'spg' loss defines no KL term"):
        resolve(cfg, "full")
