"""JSONL metrics, resume truncation, progress bar and PNG plots."""

from __future__ import annotations

import json

import pytest

from dllm_rl.training import MetricsLogger, Progress, plot_metrics, read_metrics


def test_metrics_jsonl_and_resume_truncation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLogger(path)
    for s in (1, 2, 3, 4):
        log.log(s, loss=1.0 / s, phase="train")
    rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[1]["loss"] == 0.5 and rows[0]["phase"] == "train"
    with path.open("a") as f:
        f.write('{"step": 5, "lo')  # a line cut by a crash is ignored
    resumed = MetricsLogger(path, resume_step=2)
    resumed.log(3, loss=9.0)
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 0.5), (3, 9.0)]
    MetricsLogger(path, enabled=False).log(7, loss=1.0)  # non-main ranks write nothing
    assert len(read_metrics(path)) == 3
    row = json.loads(path.read_text().splitlines()[0])
    assert set(row) == {"step", "time", "loss", "phase"}


def test_plot_metrics_writes_pngs(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for s in range(1, 6):
        log.log(s, loss=1.0 / s, **{"reward/mean": s * 0.1, "note": "text"})
    paths = plot_metrics(tmp_path)
    assert sorted(p.name for p in paths) == ["loss.png", "reward_mean.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    assert [p.name for p in plot_metrics(tmp_path, keys=["loss"])] == ["loss.png"]
    with pytest.raises(ValueError, match="available: loss, reward/mean"):
        plot_metrics(tmp_path, keys=["acc"])
    with pytest.raises(FileNotFoundError, match="metrics"):
        plot_metrics(tmp_path / "nope")


def test_progress_reports_tokens_per_second():
    bar = Progress(total=4, initial=1, disable=True)
    tps = bar.update(1, tokens=1000, loss=0.5)
    assert tps > 0
    bar.close()
