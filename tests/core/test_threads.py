"""The CPU thread count (dllm_rl/threads.py): a command's setting, then the environment, then the cores that are
free (sampled from /proc/stat), shared among a launcher's processes."""

from __future__ import annotations

import pytest
import torch

from dllm_rl import threads
from dllm_rl.threads import cpu_threads, free_cores, use_cpu_threads


@pytest.fixture()
def machine(monkeypatch):
    """Four usable cores (0-3) whose /proc/stat ticks the test sets: {core: (all, idle)} before and after."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    ticks = {"samples": []}
    monkeypatch.setattr(threads, "_cpu_ticks", lambda: ticks["samples"].pop(0))
    return ticks


def test_free_cores_are_the_usable_ones_mostly_idle_over_the_sample(machine):
    before = {0: (100, 50), 1: (100, 50), 2: (100, 50), 3: (100, 50), 7: (100, 0)}
    # core 0 all idle, core 1 half idle (free), core 2 a third idle (busy), core 3 no time passed, core 7 not ours
    machine["samples"] = [before, {0: (110, 60), 1: (110, 55), 2: (130, 60), 3: (100, 50), 7: (200, 0)}]
    assert free_cores() == 3
    machine["samples"] = [before, {c: (t + 10, i) for c, (t, i) in before.items()}]  # every core busy
    assert free_cores() == 1


def test_without_proc_stat_the_load_average_counts(machine, monkeypatch):
    machine["samples"] = [None]
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert free_cores() == 1  # 4 cores, 3 busy (rounded)


def test_setting_then_environment_then_free_cores_per_process(machine, monkeypatch):
    idle = {c: (100, 100) for c in range(4)}
    machine["samples"] = [idle, {c: (110, 110) for c in range(4)}]
    assert cpu_threads() == 4
    assert cpu_threads(requested=3) == 3  # the setting wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # three ranks of one launch share the usable cores, unsampled
    assert cpu_threads() == 1 and machine["samples"] == []
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads() == 3 and cpu_threads(requested=5) == 5  # the environment, below the setting
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        cpu_threads(requested=0)


def test_applied_on_cpu_only(machine):
    torch.set_num_threads(2)
    assert use_cpu_threads("cuda:0") == 2 and torch.get_num_threads() == 2  # another device: left alone
    assert use_cpu_threads(torch.device("cpu"), requested=3) == 3 and torch.get_num_threads() == 3
    machine["samples"] = [{0: (0, 0)}, {0: (10, 10)}]  # one free core (cores 1-3 not listed count as free)
    assert use_cpu_threads("cpu") == 4 and torch.get_num_threads() == 4
