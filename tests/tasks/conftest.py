"""Shared fixtures for the tasks tests: the benchmark data folder (skips when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_data_dir() -> Path | None:
    """``$DLLM_RL_DATA`` or ``<repo>/../shared/data`` (None when absent)."""
    env = os.environ.get("DLLM_RL_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    return path.resolve() if path.is_dir() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("benchmark data folder not found: set DLLM_RL_DATA or provide <repo>/../shared/data")
    return path
