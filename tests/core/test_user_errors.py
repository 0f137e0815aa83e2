"""Errors the user can fix: one line `dllm-rl COMMAND: error: ...` naming the file or key, exit status 2, no
traceback. One case of each kind runs through the real command line (a subprocess); its variants run
through ``cli.main`` in-process (the same handler, without another interpreter start)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_rl.cli import main
from dllm_rl.config import ConfigError, load_config
from dllm_rl.models import load_model
from dllm_rl.rl.config import RLConfig, RolloutConfig

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "src" / "dllm_rl" / "assets" / "demo"


def _start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "dllm_rl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """One real command line per kind of error, started together (each interpreter start imports torch):
    name -> (inputs, return code, stderr)."""
    root = tmp_path_factory.mktemp("user_errors")
    truncated = root / "truncated"
    shutil.copytree(DEMO / "sdar-countdown", truncated)
    good = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(good[: len(good) // 2])  # an interrupted download
    no_mask = root / "no_mask"  # config.json without mask_token_id, and no tokenizer to take it from
    shutil.copytree(DEMO / "sdar-countdown", no_mask)
    pub = json.loads((no_mask / "config.json").read_text())
    del pub["mask_token_id"]
    (no_mask / "config.json").write_text(json.dumps(pub))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_mask / name).unlink()
    empty = root / "empty.jsonl"
    empty.write_text("")
    config = str(DEMO / "rl-block.yaml")  # names its model relative to the demo folder: never loaded here
    runs = {
        "truncated": (truncated, ["info", str(truncated)]),
        "reward": (None, ["rl", config, "reward=no_such_module:score"]),
        "no_mask": (no_mask, ["info", str(no_mask)]),
        "empty": (empty, ["eval", str(DEMO / "sdar-countdown"), "--task", str(empty), "--task-type", "countdown",
                          "-o", str(root / "ev")]),
        "temperature": (None, ["rl", config, f"model={root / 'missing'}", "rollout.temperature=-1"]),
    }
    procs = {name: (inputs, _start(*args)) for name, (inputs, args) in runs.items()}
    out = {}
    for name, (inputs, proc) in procs.items():
        _, err = proc.communicate(timeout=300)
        out[name] = (inputs, proc.returncode, err)
    return out


def _one_error_line(stderr: str, command: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"dllm-rl {command}: error: "), lines[0]
    return lines[0]


def _in_process(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 2
    return _one_error_line(capsys.readouterr().err, args[0])


@pytest.fixture()
def sdar_copy(tmp_path) -> Path:
    """A copy of the shipped block demo checkpoint (91-token character vocabulary, mask id 2)."""
    d = tmp_path / "sdar"
    shutil.copytree(DEMO / "sdar-countdown", d)
    return d


def test_corrupt_weights_name_the_file(cli, sdar_copy, capsys):
    truncated, rc, err = cli["truncated"]
    assert rc == 2
    line = _one_error_line(err, "info")
    assert line.startswith(f"dllm-rl info: error: {truncated / 'model.safetensors'}: not a readable safetensors file")
    assert "corrupt or truncated" in line
    weights = sdar_copy / "model.safetensors"
    for broken in (b"", b"not a safetensors file at all" * 8):  # empty, garbage
        weights.write_bytes(broken)
        line = _in_process(capsys, "info", str(sdar_copy))
        assert f"{weights}: not a readable safetensors file" in line and f"{len(broken)} bytes" in line


def test_custom_reward_that_does_not_import_fails_at_config_time(cli, tmp_path, capsys):
    (tmp_path / "bad_reward.py").write_text("raise RuntimeError('needs a GPU')\n")
    (tmp_path / "good_reward.py").write_text("def score(prompts, completions, **cols):\n    return [0.0]\n")
    config = str(DEMO / "rl-block.yaml")  # names the model relative to the demo folder: nothing is loaded
    _, rc, err = cli["reward"]
    assert rc == 2
    line = _one_error_line(err, "rl")
    assert line.endswith("reward: 'no_such_module:score': no module named 'no_such_module' (is its folder on "
                         "PYTHONPATH?)")
    sys.path.insert(0, str(tmp_path))
    try:
        line = _in_process(capsys, "rl", config, "reward=good_reward:scor")
        assert line.endswith("reward: 'good_reward:scor': 'good_reward' has no attribute 'scor'")
        line = _in_process(capsys, "rl", config, "reward=bad_reward:score")
        assert line.endswith("reward: 'bad_reward:score': importing 'bad_reward' raised RuntimeError: needs a GPU")
        line = _in_process(capsys, "rl", config, "reward=score")
        assert line.endswith("reward: 'score': expected 'package.module:function'")
        assert load_config(RLConfig, None, ["reward=good_reward:score"]).reward == "good_reward:score"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("good_reward", None)


def test_mask_id_comes_from_the_tokenizer_when_config_json_lacks_it(cli, sdar_copy, capsys):
    cfg_file = sdar_copy / "config.json"
    pub = json.loads(cfg_file.read_text())
    del pub["mask_token_id"]
    cfg_file.write_text(json.dumps(pub))
    assert load_model(sdar_copy).mask_token_id == 2  # the tokenizer's <mask>, not SDAR's 151669
    no_mask, rc, err = cli["no_mask"]  # the same, without a tokenizer
    assert rc == 2
    line = _one_error_line(err, "info")
    no_mask_cfg = no_mask / "config.json"
    assert line == (f"dllm-rl info: error: {no_mask_cfg} has no mask_token_id, {no_mask} has no mask token, and the "
                    f"sdar default (151669) is outside the vocabulary (vocab_size 91); set mask_token_id in "
                    f"{no_mask_cfg} to the id of the mask token")
    pub["mask_token_id"] = 91
    cfg_file.write_text(json.dumps(pub))
    assert _in_process(capsys, "info", str(sdar_copy)).endswith(
        f"{cfg_file}: mask_token_id 91 is outside the vocabulary (vocab_size 91); set mask_token_id in {cfg_file} "
        "to the id of the mask token")


def test_empty_held_out_file_is_refused(cli, sdar_copy, tmp_path, capsys):
    empty, rc, err = cli["empty"]
    assert rc == 2
    line = _one_error_line(err, "eval")
    assert line == (f"dllm-rl eval: error: {empty}: no items to evaluate (task '{empty}'); give a file with at "
                    "least one item")
    line = _in_process(capsys, "rl", str(DEMO / "rl-block.yaml"), f"model={sdar_copy}",
                       f"train_data={DEMO / 'countdown_train.jsonl'}", f"eval.data={empty}", "device=cpu",
                       f"output_dir={tmp_path / 'run'}")
    assert line == (f"dllm-rl rl: error: {empty}: no held-out examples (eval.data); give a file with at least one "
                    "item or eval.limit=0 to turn the held-out evaluation off")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bad_rollout_value_fails_before_anything_is_loaded(cli):
    """The sampler's check (temperature >= 0) used to run at the first rollout, after the first held-out
    evaluation; it now runs when the config is built, so even a missing model directory is not reached."""
    _, rc, err = cli["temperature"]
    assert rc == 2
    line = _one_error_line(err, "rl")
    assert line == f"dllm-rl rl: error: {DEMO / 'rl-block.yaml'}: rollout.temperature: must be >= 0, got -1.0"
    with pytest.raises(ConfigError, match=r"^temperature: must be >= 0, got -1$"):
        RolloutConfig(temperature=-1)
    with pytest.raises(ConfigError, match=r"^rollout.top_p: must be in \(0, 1\], got 0.0$"):
        load_config(RLConfig, None, ["rollout.top_p=0"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only the user-error types are reported as one line; a KeyError from a bug propagates."""
    from dllm_rl import cli

    def buggy(args):
        raise KeyError("layer.3")

    real_build = cli.build_parser

    def build():
        parser = real_build()
        parser._subparsers._group_actions[0].choices["info"].set_defaults(func=buggy)
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    with pytest.raises(KeyError, match="layer.3"):
        cli.main(["info", "somewhere"])
