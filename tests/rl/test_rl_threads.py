"""The RL trainer chooses its CPU threads (dllm_rl/threads.py): one for a tiny model, unless the run says."""

from __future__ import annotations

import torch
from rl_helpers import countdown_root, rl_overrides

from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer


def test_a_tiny_model_trains_on_one_thread_unless_the_run_says(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    root = countdown_root(tmp_path, ["sdar"], 4, 2, hidden_size=16, intermediate_size=32, num_layers=1)
    for setting, want in ((None, 1), (2, 2)):
        torch.set_num_threads(3)
        extra = [f"train.num_threads={setting}"] if setting else []
        RLTrainer(load_config(RLConfig, None, rl_overrides(root, "sdar", tmp_path / f"run{want}", *extra)))
        assert torch.get_num_threads() == want
