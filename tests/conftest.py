"""Shared fixtures: tiny models of each family, the shared data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hub_fixture import offline_hub  # noqa: F401 - a fixture: a hub cache built by the test, read offline

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    env = os.environ.get("DLLM_RL_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    return path if path.is_dir() else None


@pytest.fixture(autouse=True)
def _few_threads():
    # The suite runs on 2 cores; tiny models are faster single-threaded and results stay deterministic.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
