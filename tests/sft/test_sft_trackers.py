"""report_to: an SFT run's TensorBoard scalars equal its metrics.jsonl, with the resolved config as
hyperparameters; trackio logs locally (a fresh process reads $TRACKIO_DIR); bad tracker names are config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_sft_trainer import _cfg

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.sft.trainer import train
from dllm_rl.training import read_metrics

REPO = Path(__file__).resolve().parents[2]


def test_tensorboard_scalars_equal_the_jsonl_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(_cfg(tmp_path, "run.report_to=tensorboard", "train.max_steps=3"), verbose=False)
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    events = EventAccumulator(str(run / "tensorboard" / "run")).Reload()
    keys = ["loss", "lr", "tokens_per_s", "epoch", "tokens", "elapsed_s"]
    assert set(keys) <= set(events.Tags()["scalars"])
    for key in keys:
        got = [(e.step, e.value) for e in events.Scalars(key)]
        want = [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows]
        assert got == want, key
    hparams = next((run / "tensorboard" / "run").glob("*/hparams.yml"))
    values = yaml.safe_load(hparams.read_text())
    assert values["train.max_steps"] == 3 and values["model.tokenizer"] == "char"
    assert values["run.report_to"] == "['tensorboard']" and values["model.path"] == "none"


def test_trackio_logs_locally_the_same_metrics(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TRACKIO_DIR": str(tmp_path / "trackio"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(REPO / "tests" / "training" / "trackio_roundtrip.py"),
                          str(tmp_path / "myrun")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    assert got["logs"] == [{"step": 1, "reward": 0.25, "kl": 0.5}, {"step": 2, "reward": 0.5, "kl": 1.0},
                           {"step": 3, "reward": 0.75, "kl": 1.5}]
    assert got["config"]["optim.lr"] == 0.001 and got["config"]["seed"] == 3
    assert (tmp_path / "trackio" / "dllm-rl.db").is_file()


def test_report_to_is_checked_with_the_config(tmp_path):
    with pytest.raises(ConfigError, match=r"^run.report_to: unknown tracker 'tensorbord'; choose from tensorboard, "
                                          r"wandb, trackio, mlflow, none$"):
        load_config(RLConfig, None, ["run.report_to=tensorbord"])
    with pytest.raises(ConfigError, match="^run.report_to: 'none' cannot be combined with trackers$"):
        load_config(RLConfig, None, ["run.report_to=[none,tensorboard]"])
    with pytest.raises(ConfigError, match=r"^run.report_to: unknown tracker 'x'"):
        _cfg(tmp_path, "run.report_to=x")
    assert load_config(RLConfig, None, ["run.report_to=tensorboard,trackio"]).run.report_to == ["tensorboard",
                                                                                                "trackio"]
    with pytest.raises(ConfigError, match="^run.push_to_hub: 'a b' is not a hub repository id"):
        load_config(RLConfig, None, ["run.push_to_hub=a b"])


def test_push_to_hub_uploads_the_final_model(tmp_path, monkeypatch):
    import dllm_rl.sft.trainer as sft_trainer

    pushed = []
    monkeypatch.setattr(sft_trainer, "push_to_hub", lambda folder, repo: pushed.append((folder, repo)) or "url")
    result = train(_cfg(tmp_path, "run.push_to_hub=me/tiny-sft", "train.max_steps=1"), verbose=False)
    assert pushed == [(tmp_path / "run" / "model", "me/tiny-sft")] and result.model_dir == pushed[0][0]
