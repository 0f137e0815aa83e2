"""The RL run directory: a real run killed while it writes a checkpoint resumes with resume=latest; an old run,
a busy directory or a file is refused before any compute; a resumed run keeps its accuracy before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from rl_helpers import rl_overrides

from dllm_rl.cli import main
from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.training import RunDirError, open_run_dir
from dllm_rl.training.checkpoint import KILL_ENV
from dllm_rl.training.run_dir import RL_RUN_FILES


def _rl(tmp_path, args, **env):
    """``python -m dllm_rl rl`` in a subprocess (``env`` added to a copy of this one's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "dllm_rl", "rl", *_yaml(tmp_path), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(rl_setup, tmp_path):
    out = tmp_path / "run"
    args = rl_overrides(rl_setup, "sdar", out, "max_steps=2", "save_every=1", "keep_checkpoints=3", "eval.limit=2",
                        "save_rollouts=2")
    killed = _rl(tmp_path, args, **{KILL_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002.tmp"]
    assert (ckpts / "step-0000002.tmp" / "trainer_state.json").is_file()  # complete but for the rename
    with open(out / "rollouts.jsonl", "a") as f:
        f.write('{"step": 2, "prompt": "cut sh')  # and a rollout line torn by the kill
    # a new run without resume would mix into this one: refused before any compute
    with pytest.raises(RunDirError, match=rf"output_dir={out} already holds a run .* pass resume=latest"):
        RLTrainer(load_config(RLConfig, None, args))

    resumed = _rl(tmp_path, [*args, "resume=latest"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {ckpts / 'step-0000001'} at step 1" in resumed.stdout
    assert f"{ckpts / 'step-0000002.tmp'}: not a complete checkpoint (a save cut short?); removed" in resumed.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002"]
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rollouts] == [1, 1, 2, 2]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["start_step"] == 1 and summary["steps"] == 2
    assert summary["accuracy_before"] == metrics[0]["eval_accuracy"]  # kept from the checkpoint


def test_busy_directory_and_a_file_are_refused_with_one_line(rl_setup, tmp_path, capsys):
    out = tmp_path / "run"
    holder = open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    try:
        assert main(["rl", *_yaml(tmp_path), *rl_overrides(rl_setup, "llada", out)]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert err == (f"dllm-rl rl: error: output_dir={out} is in use by another run (pid {os.getpid()}), a trainer of "
                   f"this process not yet closed (call its close()), which holds {out}/.lock; wait for it to finish "
                   "or choose another output_dir\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["rl", *_yaml(tmp_path), *rl_overrides(rl_setup, "llada", afile)]) == 2
    assert capsys.readouterr().err == (f"dllm-rl rl: error: output_dir={afile} is a file, not a directory; "
                                       "choose another output_dir\n")


def test_overwrite_starts_afresh_in_an_old_run_directory(rl_setup, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000009").mkdir(parents=True)
    (out / "rollouts.jsonl").write_text('{"step": 9}\n')
    (out / "log.txt").write_text("kept")
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", out, "overwrite=true"))
    trainer = RLTrainer(cfg)
    trainer.close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "config.yaml", "log.txt"]


def _yaml(tmp_path):
    config = tmp_path / "rl.yaml"
    config.write_text("algorithm: tracerl\n")
    return [str(config)]
