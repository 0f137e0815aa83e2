"""CJ-GRPO's loss on hand-computed numbers (dual clip, transition mean then sample mean) and its preset."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import load_config, to_dict
from dllm_rl.estimators import TokenScores
from dllm_rl.rl.algorithms import resolve
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig, policy_objective
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.training.resume_check import RL_APPLICABLE, check_resumed_config

LOSS = POLICY_LOSSES["cj_grpo"]
A = 0.866
# B = 2 samples, G = 4 tokens, one draw. Sample 0 (A = -0.866): transition 0 = tokens 0, 1 (ratios e^0.5 and 1),
# transition 1 = token 2 (ratio 1), transition 2 = token 3 (ratio 5: the dual clip bites). Sample 1 (A = +1):
# transition 0 = token 0 (ratio e^0.5, clipped at 1.2), transition 1 = tokens 1, 2 (ratios 1 and e^-1); token 3
# is not scored.
OLD = [[[-1.0, -2.0, -1.0, -2.0], [-1.0, -1.0, -1.0, 0.0]]]
NEW = [[[-0.5, -2.0, -1.0, -2.0 + math.log(5.0)], [-0.5, -1.0, -2.0, 0.0]]]
WEIGHT = [[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]]
TRANSITION = [[[0, 0, 1, 2], [0, 1, 1, -1]]]
ADV = torch.tensor([-A, 1.0])


def scores(logp, info=True, requires_grad=False) -> TokenScores:
    lp = torch.tensor(logp, requires_grad=requires_grad)
    return TokenScores(logp=lp, weight=torch.tensor(WEIGHT), forwards=0,
                       info={"transition": torch.tensor(TRANSITION)} if info else {})


def test_dual_clip_loss_by_hand():
    # sample 0: transition 0: max(0.866 e^0.5 = 1.42779, 0.866 * 1.2) = 1.42779 and 0.866 (the fact sheet's
    # example, mean 1.146896); transition 1: 0.866; transition 2: max(0.866 * 5, 0.866 * 1.2) = 4.33, capped at
    # 0.866 * 3 = 2.598
    s0 = ((A * math.exp(0.5) + A) / 2 + A + 3 * A) / 3
    assert (A * math.exp(0.5) + A) / 2 == pytest.approx(1.146896, abs=1e-6)
    # sample 1: transition 0: -min(e^0.5, 1.2) = -1.2; transition 1: (-1 + -e^-1) / 2 (the low ratio is not
    # clipped for A > 0)
    s1 = (-1.2 + (-1.0 - math.exp(-1.0)) / 2) / 2
    assert s0 == pytest.approx(1.536965, abs=1e-6) and s1 == pytest.approx(-0.941970, abs=1e-6)
    out = LOSS(scores(NEW), scores(OLD), None, ADV, torch.tensor([4, 3]), LossConfig())
    assert out.loss.item() == pytest.approx((s0 + s1) / 2, abs=1e-6)
    assert (s0 + s1) / 2 == pytest.approx(0.297498, abs=1e-6)
    assert out.stats["dual_clip_frac"] == pytest.approx(1 / 7) and out.stats["clip_frac"] == pytest.approx(1 / 7)
    assert out.stats["ratio_max_dev"] == pytest.approx(4.0, abs=1e-5)
    # dual clip off (the authors' code): token 3 keeps 4.33
    off = LOSS(scores(NEW), scores(OLD), None, ADV, torch.tensor([4, 3]), LossConfig(options={"dual_clip": None}))
    assert off.loss.item() == pytest.approx((((A * math.exp(0.5) + A) / 2 + A + 5 * A) / 3 + s1) / 2, abs=1e-6)
    # without transition ids (another estimator) a sample's tokens are one transition: its token mean
    pooled = LOSS(scores(NEW, info=False), scores(OLD), None, ADV, torch.tensor([4, 3]), LossConfig())
    want = ((A * math.exp(0.5) + A + A + 3 * A) / 4 + (-1.2 - 1.0 - math.exp(-1.0)) / 3) / 2
    assert pooled.loss.item() == pytest.approx(want, abs=1e-6)


def test_dual_clipped_token_has_no_gradient_and_weights_follow_the_transitions():
    new = scores(NEW, requires_grad=True)
    out = LOSS(new, scores(OLD), None, ADV, torch.tensor([4, 3]), LossConfig())
    (grad,) = torch.autograd.grad(out.loss, new.logp)
    # d loss / d logp = weight of the token * d(term)/d(logp); sample 0's token 0: (1/2 samples) (1/3 transitions)
    # (1/2 tokens) * 0.866 * e^0.5; token 2: (1/2)(1/3)(1/1) * 0.866 * 1; token 3 is capped: 0
    assert grad[0, 0].tolist() == pytest.approx([A * math.exp(0.5) / 12, A / 12, A / 6, 0.0], abs=1e-6)
    # sample 1: token 0 clipped (0); tokens 1, 2: (1/2)(1/2)(1/2) * -ratio
    assert grad[0, 1].tolist() == pytest.approx([0.0, -1 / 8, -math.exp(-1.0) / 8, 0.0], abs=1e-6)


def test_loss_options_are_checked_and_kl_is_per_token():
    lengths = torch.tensor([4, 3])
    with pytest.raises(ValueError, match="dual-clip constant must be a number > 1 \\(DARE: 3\\) or null, got 1"):
        LOSS(scores(NEW), scores(OLD), None, ADV, lengths, LossConfig(options={"dual_clip": 1}))
    with pytest.raises(ValueError, match="loss_options: clip_ratio_c not read by the 'cj_grpo' loss; valid: dual_clip"):
        LOSS(scores(NEW), scores(OLD), None, ADV, lengths, LossConfig(options={"clip_ratio_c": 3}))
    with pytest.raises(ValueError, match="a scored token has no transition"):
        bad = scores(NEW)
        bad.info["transition"] = torch.tensor([[[0, 0, 1, -1], [0, 1, 1, -1]]])
        LOSS(bad, scores(OLD), None, ADV, lengths, LossConfig())
    # beta > 0: k3 per scored token, reduced by loss_aggregation (seq_mean here), added once by policy_objective
    cfg = LossConfig(beta=0.5, aggregation="seq_mean")
    out = policy_objective(LOSS, scores(NEW), scores(OLD), scores(OLD), ADV, lengths, cfg)
    base = LOSS(scores(NEW), scores(OLD), None, ADV, lengths, cfg).loss.item()

    def k3(d):  # k3(logp, ref) = e^(ref - logp) - (ref - logp) - 1
        return math.exp(-d) + d - 1

    kl = ((k3(0.5) + 0 + 0 + k3(math.log(5.0))) / 4 + (k3(0.5) + 0 + k3(-1.0)) / 3) / 2
    assert out.stats["kl"] == pytest.approx(kl, abs=1e-6)
    assert out.loss.item() == pytest.approx(base + 0.5 * kl, abs=1e-6)


def test_preset_resolves_and_step_merge_takes_the_rollout_block():
    over = ["model.path=m", "algorithm=cj_grpo", "rollout.gen_length=64", "rollout.block_length=16"]
    cfg = resolve(load_config(RLConfig, None, over), "full")
    assert (cfg.estimator, cfg.estimator_options, cfg.loss_type, cfg.loss_options) == (
        "trace", {"shrinkage": 1, "mask_uncounted": True}, "cj_grpo", {"dual_clip": 3.0})
    assert (cfg.beta, cfg.advantage, cfg.scale_rewards, cfg.epsilon) == (0.0, "group_zscore", "group", 0.2)
    merged = resolve(load_config(RLConfig, None, [*over, "estimator_options={step_merge: true}"]), "full")
    assert merged.estimator_options == {"step_merge": True, "block_length": 16}
    block = resolve(load_config(RLConfig, None, [*over[:3], "estimator_options={step_merge: true}"]), "block")
    assert block.estimator_options == {"step_merge": True}
    # TraceRL's shrinkage default (8 on full attention) is not filled in beside step_merge
    trace = resolve(load_config(RLConfig, None, ["model.path=m", "algorithm=tracerl", "rollout.gen_length=64",
                                                 "estimator_options={step_merge: true}"]), "full")
    assert trace.estimator_options == {"step_merge": True, "block_length": 64}


def test_a_cj_grpo_step_with_gradient_checkpointing_matches_one_without(rl_setup, tmp_path):
    """model.gradient_checkpointing (an update keeps only the layers' inputs of its rows: CJ-GRPO forwards every
    decoding step) recomputes the layers in backward: the step's weights are the same as without it."""
    weights = []
    for on in (False, True):
        over = rl_overrides(rl_setup, "llada", tmp_path / f"run{on}", "algorithm=cj_grpo", "rollout.steps=4",
                            f"model.gradient_checkpointing={str(on).lower()}")
        trainer = RLTrainer(load_config(RLConfig, None, over), reward_fn=digit_reward)
        try:
            assert trainer.model.hf_model.is_activation_checkpointing is on
            before = [p.detach().clone() for p in trainer.model.model.parameters()]
            metrics = trainer.step().metrics
            assert metrics["ratio_dev_first_update"] == 0.0 and math.isfinite(metrics["loss"])
            weights.append([p.detach().clone() for p in trainer.model.model.parameters()])
        finally:
            trainer.close()
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(*weights))
    assert any(not torch.equal(a, b) for a, b in zip(weights[1], before))


def test_gradient_checkpointing_may_change_on_resume(tmp_path):
    """It changes how an update is computed, not what: a resumed run may turn it on or off (RL_APPLICABLE)."""
    saved = load_config(RLConfig, None, ["model.path=m", "algorithm=cj_grpo"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(saved)))
    now = load_config(RLConfig, None, ["model.path=m", "algorithm=cj_grpo", "model.gradient_checkpointing=true"])
    assert check_resumed_config(tmp_path, now, RL_APPLICABLE) == ["model.gradient_checkpointing False -> True"]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_step_merge_trains_one_transition_per_block(rl_setup, tmp_path, family):
    """step_merge through the trainer: the rollout's block (4) fills block_length on full attention, the block model
    merges its layout blocks; the first update's ratio is 1 and the weights move."""
    over = rl_overrides(rl_setup, family, tmp_path / "run", "algorithm=cj_grpo", "rollout.block_length=4",
                        "estimator_options={step_merge: true, mask_uncounted: true}")
    trainer = RLTrainer(load_config(RLConfig, None, over), reward_fn=digit_reward)
    try:
        want = {"step_merge": True, "mask_uncounted": True, **({"block_length": 4} if family == "llada" else {})}
        assert trainer.cfg.estimator_options == want
        before = [p.detach().clone() for p in trainer.model.model.parameters()]
        metrics = trainer.step().metrics
        assert metrics["ratio_dev_first_update"] == 0.0 and math.isfinite(metrics["loss"])
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.model.parameters()))
    finally:
        trainer.close()
