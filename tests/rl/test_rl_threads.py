"""The RL trainer sets torch's CPU threads when it starts (dllm_rl/threads.py): the run's setting, else the
environment's, else the free cores."""

from __future__ import annotations

import torch
from rl_helpers import countdown_root, rl_overrides

from dllm_rl import threads
from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer


def test_the_trainer_applies_the_setting_else_the_free_cores(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(threads, "free_cores", lambda: 3)
    root = countdown_root(tmp_path, ["sdar"], 4, 2, hidden_size=16, intermediate_size=32, num_layers=1)
    for setting, want in ((None, 3), (2, 2)):
        torch.set_num_threads(1)
        extra = [f"train.num_threads={setting}"] if setting else []
        RLTrainer(load_config(RLConfig, None, rl_overrides(root, "sdar", tmp_path / f"run{want}", *extra)))
        assert torch.get_num_threads() == want
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as the suite and the learning benchmark run
    RLTrainer(load_config(RLConfig, None, rl_overrides(root, "sdar", tmp_path / "run_env")))
    assert torch.get_num_threads() == 1
