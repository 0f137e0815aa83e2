"""The CPU thread count (dllm_rl/threads.py): what a command's setting, the environment, the model's size and the
machine's free cores give, and the trainers applying it."""

from __future__ import annotations

import pytest
import torch

from dllm_rl import threads
from dllm_rl.threads import SMALL_MODEL_PARAMS, cpu_threads, free_cores, use_cpu_threads


@pytest.fixture()
def machine(monkeypatch):
    """A machine of 8 usable cores whose 1-minute load average the test sets."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)))
    load = {"avg": 0.0}
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load["avg"], 0.0, 0.0))
    return load


def test_free_cores_are_the_usable_ones_less_the_busy_ones(machine):
    assert free_cores() == 8
    machine["avg"] = 2.6  # three cores busy (rounded)
    assert free_cores() == 5
    machine["avg"] = 30.0  # an overloaded machine still gets one
    assert free_cores() == 1


def test_setting_then_environment_then_model_size(machine, monkeypatch):
    machine["avg"] = 1.2
    assert cpu_threads(SMALL_MODEL_PARAMS - 1) == 1  # a tiny model: one thread, whatever is free
    assert cpu_threads(SMALL_MODEL_PARAMS) == 7  # a large one: the free cores
    assert cpu_threads(8_000_000_000, requested=3) == 3 and cpu_threads(10, requested=4) == 4  # the setting wins
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads(10) == 2 and cpu_threads(8_000_000_000) == 2  # then the environment
    assert cpu_threads(10, requested=5) == 5
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        cpu_threads(10, requested=0)


def test_applied_on_cpu_only(machine):
    model = torch.nn.Linear(10, 10)  # 110 parameters
    torch.set_num_threads(2)
    assert use_cpu_threads(model, "cpu") == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert use_cpu_threads(model, "cuda:0") == 2 and torch.get_num_threads() == 2  # another device: left alone
    assert use_cpu_threads(model, torch.device("cpu"), requested=3) == 3 and torch.get_num_threads() == 3
