"""benchmarks/gpu_smoke.py at its tiny CPU size: both algorithms run 2 steps and print finite, positive figures; the
engine comparison gives the fixed batches' tokens on rows of different lengths; grouped attention gives transformers'
SDPA's output."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_smoke.py"
FIGURES = ("rollout_tokens_per_s", "update_tokens_per_s", "peak_memory_gib")


@pytest.mark.slow
def test_gpu_smoke_tiny_prints_finite_figures(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny"], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = [line.split() for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert [r[1:3] for r in results] == [["tiny-sdar", "tracerl"], ["tiny-sdar", "espo"], ["tiny-sdar", "engine"],
                                         ["tiny-sdar", "attention"]]
    attention = dict(re.fullmatch(r"(\w+)=(\S+)", kv).groups() for kv in results.pop()[3:])
    assert float(attention["max_abs_diff"]) == 0.0 and float(attention["grouped_ms"]) > 0
    engine = dict(re.fullmatch(r"(\w+)=(\S+)", kv).groups() for kv in results.pop()[3:])
    assert float(engine["same_rows"]) == 1.0 and float(engine["continuous_over_fixed"]) > 0
    assert float(engine["nfe_min"]) < float(engine["nfe_max"])  # rows stopped after different numbers of steps
    for r in results:
        values = dict(re.fullmatch(r"(\w+)=(\S+)", kv).groups() for kv in r[3:])
        assert sorted(values) == sorted(FIGURES)
        assert all(math.isfinite(float(v)) and float(v) > 0 for v in values.values()), r
