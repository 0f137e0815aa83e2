"""RAFT's advantage rule: the accepted samples weigh 1, the others 0, whatever their group."""

from __future__ import annotations

import pytest
import torch

from dllm_rl.rl.advantages import compute_advantages


def test_raft_weighs_the_right_answers_one_and_the_rest_zero():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = compute_advantages("raft", rewards, 4, "group")  # scale_rewards is not read
    assert adv.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    # GRPO on the same groups pushes the wrong answers down; RAFT never does
    grpo = compute_advantages("group_zscore", rewards, 4, "group")
    assert grpo[1] < 0 and (adv >= 0).all()


def test_raft_accepts_from_min_reward_on():
    rewards = torch.tensor([0.2, 0.5, 0.9, 0.4])
    assert compute_advantages("raft", rewards, 2, "none", {"min_reward": 0.5}).tolist() == [0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="advantage_options: k not read by the 'raft' advantage; valid: min_reward"):
        compute_advantages("raft", rewards, 2, "none", {"k": 2})
