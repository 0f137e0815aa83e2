"""JSONL metrics, resume truncation, the progress line, the dashboard and opt-in per-metric PNGs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dllm_rl.training import (
    ZERO_LOSS_NOTE,
    MetricsLogger,
    Progress,
    loss_is_informative,
    plot_metrics,
    read_metrics,
    rl_progress,
    write_dashboard,
)
from dllm_rl.training.plots import dashboard_figure, smooth


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


def _rl_run(path, n=12, scale=1.0):
    log = MetricsLogger(path / "metrics.jsonl")
    log.log(0, eval_accuracy=0.25 * scale, eval_reward=0.3, eval_nfe=16.0)
    for s in range(1, n + 1):
        log.log(s, reward=scale * (s % 3) / 2, kl=0.001 * s, clip_frac=0.01 * (s % 4), completion_length=10 + s,
                nfe=20 - s / 2, time_rollout=1.5, time_reward=0.25, time_update=0.5 + s / 100)
    log.log(n, eval_accuracy=0.5 * scale, eval_reward=0.6, eval_nfe=4.0)


def test_dashboard_panels_hold_the_runs_data(tmp_path):
    a, b = tmp_path / "espo", tmp_path / "tracerl"
    _rl_run(a)
    _rl_run(b, scale=0.5)
    fig = dashboard_figure([a, b], smooth_window=3)
    reward, held_out, kl, length, seconds, passes, clip = fig.axes
    assert [ax.get_title() for ax in fig.axes[:6]] == [
        "reward", "held-out accuracy", "KL and clip fraction", "completion length and NFE", "seconds per step",
        "held-out accuracy vs passes"]
    steps = np.arange(1, 13, dtype=float)
    raw = (steps % 3) / 2
    # per run: raw reward, then its trailing mean over 3 steps
    np.testing.assert_allclose(reward.lines[0].get_xydata(), np.c_[steps, raw])
    np.testing.assert_allclose(reward.lines[1].get_ydata(), smooth(raw, 3))
    assert reward.lines[1].get_ydata()[:3].tolist() == [0.5, 0.75, 0.5]
    np.testing.assert_allclose(reward.lines[2].get_ydata(), raw * 0.5)  # the second run, overlaid
    assert held_out.lines[0].get_xydata().tolist() == [[0.0, 0.25], [12.0, 0.5]]
    assert held_out.lines[1].get_xydata().tolist() == [[0.0, 0.125], [12.0, 0.25]]
    np.testing.assert_allclose(kl.lines[0].get_ydata(), 0.001 * steps)
    np.testing.assert_allclose(clip.lines[0].get_ydata(), 0.01 * (steps % 4))
    np.testing.assert_allclose(length.lines[0].get_ydata(), 10 + steps)
    np.testing.assert_allclose(length.lines[1].get_ydata(), 20 - steps / 2)
    assert [line.get_label() for line in seconds.lines[:3]] == ["espo rollout", "espo reward", "espo update"]
    np.testing.assert_allclose(seconds.lines[2].get_ydata(), 0.5 + steps / 100)
    assert len(seconds.lines) == 6
    # accuracy against passes per answer: step 0 at 16 passes, the last evaluation at 4
    assert passes.lines[0].get_xydata().tolist() == [[16.0, 0.25], [4.0, 0.5]]
    assert passes.lines[1].get_xydata().tolist() == [[16.0, 0.125], [4.0, 0.25]]
    assert passes.get_xlabel() == "forward passes per answer"
    assert sorted(t.get_text() for t in passes.texts) == ["step 0", "step 0", "step 12", "step 12"]
    out = write_dashboard([a])
    assert out == a / "dashboard.png" and out.read_bytes()[:4] == b"\x89PNG"


def test_dashboard_fits_a_laptop_screen_and_writes_no_data_only_on_an_empty_panel(tmp_path):
    """Six panels in 2 rows of 3, at most 1600 x 900 px; a run without KL (beta 0) still draws its clip fraction
    on panel 3's right-hand axis, so that panel says nothing about missing data, and its legend names the clip
    fraction; a panel with no point at all says "no data"."""
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for s in range(1, 5):
        log.log(s, reward=s / 4, clip_frac=0.01 * s, completion_length=10 + s)
    fig = dashboard_figure([tmp_path])
    width, height = fig.get_size_inches() * fig.dpi
    assert (width, height) == (1600, 850)
    panels, clip = fig.axes[:6], fig.axes[6]
    assert [ax.get_subplotspec().get_geometry() for ax in panels] == [(2, 3, i, i) for i in range(6)]
    assert clip.lines[0].get_xydata().tolist() == [[1.0, 0.01], [2.0, 0.02], [3.0, 0.03], [4.0, 0.04]]
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in panels}
    assert texts == {"reward": [], "held-out accuracy": ["no data"], "KL and clip fraction": [],
                     "completion length and NFE": [], "seconds per step": ["no data"],
                     "held-out accuracy vs passes": ["no data"]}
    assert [t.get_text() for t in panels[2].get_legend().get_texts()] == [f"{tmp_path.name} clip_frac"]
    out = write_dashboard([tmp_path])
    from PIL import Image

    assert Image.open(out).size == (1600, 850)


def test_dashboard_of_an_sft_run_shows_the_loss(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for s in (10, 20, 30):
        log.log(s, loss=3.0 / s * 10, lr=1e-3)
    fig = dashboard_figure([tmp_path])
    assert fig.axes[0].get_title() == "loss"
    assert fig.axes[0].lines[0].get_xydata().tolist() == [[10.0, 3.0], [20.0, 1.5], [30.0, 1.0]]
    assert [t.get_text() for t in fig.axes[1].texts] == ["no data"]


def test_dashboard_draws_the_policys_own_reward_beside_the_reward_after_a_hook(tmp_path):
    log = MetricsLogger(tmp_path / "metrics.jsonl")
    for s, (after, own) in enumerate([(0.5, 0.0), (0.75, 0.25), (1.0, 1.0)], 1):
        log.log(s, reward=after, reward_policy=own)
    lines = dashboard_figure([tmp_path], smooth_window=1).axes[0].lines
    assert [line.get_label().split(" ", 1)[1] for line in lines] == ["reward", "reward (smoothed)",
                                                                      "reward_policy (smoothed)"]
    assert lines[2].get_xydata().tolist() == [[1.0, 0.0], [2.0, 0.25], [3.0, 1.0]]
    assert lines[2].get_linestyle() == "--"


def test_progress_line_shows_reward_held_out_kl_clip_tokens_and_eta(capsys):
    bar = Progress(total=4, initial=1, disable=False, desc="rl/espo", note=ZERO_LOSS_NOTE)
    assert ZERO_LOSS_NOTE in capsys.readouterr().out
    row = {"reward": 0.3125, "kl": 0.00123, "clip_frac": 0.05, "loss": 0.0}
    bar.update(1, tokens=1000, **rl_progress(row, held_out=0.19, show_loss=False))
    assert bar.postfix.startswith("reward=0.3125, held_out=0.19, kl=0.00123, clip=0.05, tok/s=")
    assert "ETA" in str(bar.bar) and "loss" not in str(bar.bar)
    bar.update(1, tokens=10, **rl_progress({"reward": 1.0, "loss": -0.25}, show_loss=True))
    assert bar.postfix.startswith("reward=1, loss=-0.25, tok/s=")
    bar.close()
    assert not loss_is_informative("sequence", None)  # ESPO
    assert not loss_is_informative("token", "seq_mean")
    assert loss_is_informative("token", "token_mean")  # TraceRL, diffu-GRPO
