"""benchmarks/bench.py (`make bench`): the gate's logic on a clock of its own, so a fast path slowed on purpose fails
it without any timing noise; and its reference loop on a tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from dllm_rl.models import build_model, tiny_config

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench"] = bench
_spec.loader.exec_module(bench)


class FakeClock:
    """A clock that moves only when a run says it took time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def run(self, seconds: float):
        def spend():
            self.now += seconds
        return spend


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(bench, "CLOCK", fake)
    return fake


def test_the_gate_passes_at_its_floor_and_fails_when_the_fast_path_is_slowed(clock, monkeypatch, tmp_path, capsys):
    floor = tmp_path / "bench_floor.json"
    floor.write_text(json.dumps({"llada-countdown": 3.0, "sdar-countdown": 20.0}))
    monkeypatch.setattr(bench, "FLOOR", floor)
    slow = {"sdar-countdown": 0.0}  # seconds the fast path is slowed by, per model

    def pair(name, n_prompts):
        reference = clock.run({"llada-countdown": 4.0, "sdar-countdown": 10.0}[name])
        base = clock.run(1.0 if name == "llada-countdown" else 0.25)
        return reference, lambda: (base(), clock.run(slow.get(name, 0.0))())

    monkeypatch.setattr(bench, "demo_pair", pair)
    assert bench.main(["--rounds", "3"]) == 0  # 4x >= 3x, 40x >= 20x
    assert "bench: ok" in capsys.readouterr().out
    slow["sdar-countdown"] = 0.75  # 10 / (0.25 + 0.75) = 10x, below 20x
    assert bench.main(["--rounds", "3"]) == 1
    out = capsys.readouterr()
    assert "sdar-countdown: 10.00x the reference, below its floor 20.00x" in out.err
    assert "llada-countdown" not in out.err and "bench: FAILED" in out.out


def test_the_median_of_interleaved_runs_counts_and_a_missing_floor_fails(clock):
    times = iter([5.0, 1.0, 9.0])  # one slow outlier among the fast runs
    fast = lambda: clock.run(next(times))()  # noqa: E731
    ratios, bad = bench.gate({"m": (clock.run(10.0), fast)}, {"m": 2.0}, rounds=3)
    assert ratios == {"m": 2.0} and bad == []  # median 5 of (5, 1, 9): 10 / 5
    assert bench.check({"m": 2.0, "new": 9.0}, {"m": 2.5}) == [
        "m: 2.00x the reference, below its floor 2.50x",
        "new: no floor in bench_floor.json; run benchmarks/bench.py --write-floor"]


def test_the_reference_loop_commits_one_slot_per_pass():
    model = build_model("llada", tiny_config("llada", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                                             num_kv_heads=2, intermediate_size=32), seed=0).eval()
    calls = []
    real = model.forward
    model.forward = lambda ids, *a, **k: calls.append(int((ids == model.mask_token_id).sum())) or real(ids, *a, **k)
    out = bench.reference_decode(model, [1, 2, 3], gen_length=8, block=4)
    assert calls == [8, 7, 6, 5, 4, 3, 2, 1] and model.mask_token_id not in out and len(out) == 8
    assert isinstance(out[0], int) and torch.is_grad_enabled()
