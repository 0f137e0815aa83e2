"""rollout.decoding=learned (DiFFPO's per-prompt threshold): the RL loop trains the head and saves it with the model,
and generate --decoding learned reads it back."""

import json

import pytest
from rl_helpers import alternating_reward, rl_overrides

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.sampling.threshold_head import HEAD_FILE, load_head


def test_two_steps_train_save_and_load_the_head(rl_setup, tmp_path, capsys):
    out = tmp_path / "run"
    train(load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", out, "algorithm=espo", "train.max_steps=2", "rollout.decoding=learned",
        "rollout.learned_range=[0.01,0.2]", "rollout.learned_lr=0.1", "run.save_every=1",
        "drop_zero_variance=false")), reward_fn=alternating_reward)
    head = load_head(out / "final")
    assert (head.t_min, head.t_max) == (0.01, 0.2)
    moved = head.linear.weight.detach().abs().sum() + head.linear.bias.detach().abs()
    assert float(moved) > 0  # from its zero start
    assert sorted(p.name for p in (out / "checkpoints").glob(f"*/{HEAD_FILE}"))  # checkpoints carry it too
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    drawn = [r["learned_threshold"] for r in rows if "learned_threshold" in r]
    assert len(drawn) == 2 and all(0.01 < t < 0.2 for t in drawn)
    assert all("learned_threshold_loss" in r for r in rows if "learned_threshold" in r)
    from dllm_rl.cli import main

    capsys.readouterr()
    assert main(["generate", str(out / "final"), "--prompt", "1 2 3", "--decoding", "learned", "--gen-length", "8",
                 "--block-length", "8"]) == 0
    assert "1 prompt(s)" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    ("rollout.threshold=0.9", "rollout.decoding=learned chooses each prompt's threshold: drop rollout.steps"),
    ("rollout.learned_range=[0.9,0.5]", r"rollout.learned_range: need \[t_min, t_max\] with 0 < t_min < t_max"),
    ("rollout_hook=mdpo", "the rollout hook 'mdpo' replaces or retrains rollouts"),
])
def test_learned_decoding_refusals(extra, message):
    from dllm_rl.rl.algorithms import check_combination

    cfg = load_config(RLConfig, None, ["model.path=m", "algorithm=espo", "advantage=group_zscore",
                                       "scale_rewards=group", "loss_type=sequence", "estimator=elbo",
                                       "rollout.decoding=learned", extra])
    with pytest.raises(ConfigError, match=message):
        check_combination(cfg)
