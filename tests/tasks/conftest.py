"""Benchmark files for the tasks tests: the complete file of the benchmark-data folder when present (a
benchmark run), else the sample bundled with the package, so nothing skips on a fresh clone."""

from __future__ import annotations

from pathlib import Path

import pytest

from dllm_rl.tasks.io import ASSETS_DATA, find_data_dir


def benchmark_file(full: str, sample: str) -> tuple[Path, bool]:
    """``(path, complete)``: the benchmark-data folder's ``full`` file, else the bundled ``sample``."""
    root = find_data_dir()
    if root is not None and (root / full).is_file():
        return root / full, True
    return ASSETS_DATA / sample, False


@pytest.fixture(scope="session")
def gsm8k_test() -> tuple[Path, int]:
    path, complete = benchmark_file("gsm8k/test.jsonl", "gsm8k/test_sample.jsonl")
    return path, 1319 if complete else 50


@pytest.fixture(scope="session")
def math500_test() -> tuple[Path, int]:
    path, complete = benchmark_file("math/math500_test.jsonl", "math/math500_test_sample.jsonl")
    return path, 500 if complete else 50


@pytest.fixture(scope="session")
def mbpp_test() -> tuple[Path, int]:
    path, complete = benchmark_file("mbpp/mbpp.jsonl", "mbpp/mbpp_test_sample.jsonl")
    return path, 500 if complete else 50
