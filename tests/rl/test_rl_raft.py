"""RAFT's advantage rule: the accepted samples weigh 1, the others 0, whatever their group."""

from __future__ import annotations

from pathlib import Path

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


def test_raft_trains_on_the_accepted_samples_alone(rl_setup, tmp_path):
    """RAFT fine-tunes on the accepted samples: the wrong answers of a group with signal leave the update (they
    weigh 0 and would only shrink the mean), so the step keeps the right answers and its loss is their mean."""
    from rl_helpers import alternating_reward, rl_overrides

    from dllm_rl.config import load_config
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.trainer import RLTrainer

    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=espo", "advantage=raft"))
    trainer = RLTrainer(cfg, reward_fn=alternating_reward)  # 1, 0, 1, 0, ...: both groups of 4 have signal
    batch = trainer.collect()
    assert batch.advantages.tolist() == [1.0, 0.0] * 4
    assert batch.keep.tolist() == [0, 2, 4, 6] and batch.rejected == 4  # the right answers only
    trainer.close()
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / "grpo", "algorithm=espo"))
    trainer = RLTrainer(cfg, reward_fn=alternating_reward)  # a weighing rule keeps every sample of the groups
    assert trainer.collect().keep.tolist() == list(range(8))
    trainer.close()
    # with a value model its token advantages replace the rule's over whole groups: nothing is selected away
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / "value", "algorithm=tracerl",
                                                   "advantage=raft", "value_model.enabled=true"))
    trainer = RLTrainer(cfg, reward_fn=alternating_reward)
    batch = trainer.collect()
    assert batch.keep.tolist() == list(range(8)) and batch.rejected == 0
    trainer.close()


@pytest.mark.parametrize("rule, options, problem", [
    ("raft", {"min_reward": "a"}, "min_reward must be a finite number, got 'a'"),
    ("raft", {"min_reward": [1]}, "min_reward must be a finite number, got [1]"),
    ("raft", {"min_reward": None}, "min_reward must be a finite number, got None"),
    ("raft", {"min_reward": float("nan")}, "min_reward must be a finite number, got nan"),
    ("raft", {"min_reward": True}, "min_reward must be a finite number, got True"),
    ("pass_at_k", {"k": "x"}, "k must be an integer, got 'x'"),
    ("pass_at_k", {"k": 2.5}, "k must be an integer, got 2.5"),
])
def test_an_advantage_option_of_the_wrong_kind_is_refused_by_name(rule, options, problem):
    """An option's value must be of its default's kind (a TypeError from inside the rule before; a NaN min_reward
    rejected every sample silently)."""
    with pytest.raises(ValueError) as exc:
        compute_advantages(rule, torch.tensor([0.0, 1.0, 0.0, 1.0]), 4, "none", options)
    assert str(exc.value) == f"advantage_options: {problem}"


def test_a_min_reward_that_is_not_a_number_is_one_line_at_the_command_line(capsys, tmp_path):
    from dllm_rl.cli import main

    demo = Path(__file__).resolve().parents[2] / "src" / "dllm_rl" / "assets" / "demo"
    capsys.readouterr()
    rc = main(["rl", str(demo / "rl-gemma.yaml"), f"model.path={demo / 'gemma-countdown'}",
               f"data.train_file={demo / 'countdown_train.jsonl'}", f"run.output_dir={tmp_path}", "advantage=raft",
               "advantage_options={min_reward: a}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip() == "dllm-rl rl: error: advantage_options: min_reward must be a finite number, got 'a'"


@pytest.mark.parametrize("drop_zero_variance", ["true", "false"])
def test_a_step_whose_every_sample_raft_turns_away_says_so(rl_setup, tmp_path, caplog, drop_zero_variance):
    """A min_reward no reward reaches: the groups have signal (1, 0, 1, 0) but RAFT accepts none of their samples,
    so no step updates. The warning and the stop name RAFT's rejection, not "all-equal rewards" (which they claimed
    before, wrongly: no group had all-equal rewards, and with drop_zero_variance=false none would be dropped)."""
    import logging

    from rl_helpers import alternating_reward, rl_overrides

    from dllm_rl.config import load_config
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.loop import train
    from dllm_rl.training.finite import TrainingStopped

    caplog.set_level(logging.WARNING, logger="dllm_rl.rl.skipped_steps")
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=espo", "advantage=raft",
                                                   "advantage_options={min_reward: 2}", "train.max_steps=3",
                                                   "train.max_skipped_steps=1",
                                                   f"drop_zero_variance={drop_zero_variance}"))
    why = ("advantage 'raft' accepted no sample (it turned away all 8 samples of the groups kept, with "
           "advantage_options {'min_reward': 2})")
    with pytest.raises(TrainingStopped) as exc:
        train(cfg, reward_fn=alternating_reward)
    assert str(exc.value) == (f"stopping at step 1: 1 steps in a row were skipped, {why}; check advantage_options "
                              "against the rewards in rollouts.jsonl (raft accepts a sample whose reward is >= "
                              "min_reward), or set train.max_skipped_steps=0 to go on")
    warned = [r.getMessage() for r in caplog.records if "no update" in r.getMessage()]
    assert warned == [f"step 1: no update, {why}; 1 step(s) in a row (the run stops at 1)"]
