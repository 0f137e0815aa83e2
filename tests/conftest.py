"""Shared fixtures: a thread limit for every test (and its processes), and a hub cache read offline
(``offline_hub``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hub_fixture import offline_hub  # noqa: F401 - a fixture: a hub cache built by the test, read offline

REPO = Path(__file__).resolve().parents[1]

# One thread in every test and in the processes tests start: the trainers and commands would otherwise choose the
# cores that happen to be free (dllm_rl/threads.py), which differ from run to run and move results by rounding.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _few_threads():
    # The suite runs on 2 cores; tiny models are faster single-threaded and results stay deterministic.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
