"""The RL run directory: a real run killed while it writes a checkpoint resumes with run.resume=latest; an old run,
a busy directory or a file is refused before any compute; a resumed run keeps its accuracy before training."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from full_disk import disk_full_at
from rl_helpers import rl_overrides

from dllm_rl.cli import main
from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.training import RunDirError, open_run_dir
from dllm_rl.training.checkpoint import KILL_ENV
from dllm_rl.training.run_dir import MANIFEST, RL_RUN_FILES


def _rl(tmp_path, args, **env):
    """``python -m dllm_rl rl`` in a subprocess (``env`` added to a copy of this one's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "dllm_rl", "rl", *_yaml(tmp_path), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(rl_setup, tmp_path):
    out = tmp_path / "run"
    args = rl_overrides(rl_setup, "sdar", out, "train.max_steps=2", "run.save_every=1", "run.keep_checkpoints=3",
                        "eval.limit=2",
                        "log.rollouts=2")
    killed = _rl(tmp_path, args, **{KILL_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002.tmp"]
    assert (ckpts / "step-0000002.tmp" / "trainer_state.json").is_file()  # complete but for the rename
    with open(out / "rollouts.jsonl", "a") as f:
        f.write('{"step": 2, "prompt": "cut sh')  # and a rollout line torn by the kill
    # a new run without resume would mix into this one: refused before any compute
    with pytest.raises(RunDirError, match=rf"run.output_dir={out} already holds a run .* pass run.resume=latest"):
        RLTrainer(load_config(RLConfig, None, args))

    resumed = _rl(tmp_path, [*args, "run.resume=latest"])
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
    assert err == (f"dllm-rl rl: error: run.output_dir={out} is in use by another run (pid {os.getpid()}), a trainer "
                   f"of "
                   f"this process not yet closed (call its close()), which holds {out}/.lock; wait for it to finish "
                   "or choose another run.output_dir\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["rl", *_yaml(tmp_path), *rl_overrides(rl_setup, "llada", afile)]) == 2
    assert capsys.readouterr().err == (f"dllm-rl rl: error: run.output_dir={afile} is a file, not a directory; "
                                       "choose another run.output_dir\n")


def test_overwrite_starts_afresh_in_an_old_run_directory(rl_setup, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000009").mkdir(parents=True)
    (out / "rollouts.jsonl").write_text('{"step": 9}\n')
    (out / "log.txt").write_text("kept")
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", out, "run.overwrite=true"))
    trainer = RLTrainer(cfg)
    trainer.close()
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, ".lock", "config.yaml", "log.txt"]


def _yaml(tmp_path):
    config = tmp_path / "rl.yaml"
    config.write_text("algorithm: tracerl\n")
    return [str(config)]


def test_overwrite_refuses_to_delete_the_model_the_run_starts_from(rl_setup, tmp_path, capsys):
    """model.path=runs/own/final output_dir=runs/own overwrite=true: one line, exit 2, the weights still there."""
    out = tmp_path / "own"
    shutil.copytree(rl_setup / "llada", out / "final")
    (out / "config.yaml").write_text("algorithm: tracerl\n")
    args = rl_overrides(rl_setup, "llada", out, f"model.path={out / 'final'}", "run.overwrite=true")
    assert main(["rl", *_yaml(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err == (f"dllm-rl rl: error: run.overwrite=true would delete {out}/final/config.json, and "
                   f"model.path={out / 'final'} lies in or under it: the run would destroy what it starts from; "
                   "copy model.path "
                   f"out of {out} first, or choose another run.output_dir\n")
    assert sorted(p.name for p in (out / "final").iterdir()) == sorted(p.name for p in (rl_setup / "llada").iterdir())


def test_resume_refuses_changes_that_make_another_run_and_applies_the_others(rl_setup, tmp_path, capsys,
                                                                             monkeypatch):
    out = tmp_path / "run"
    args = rl_overrides(rl_setup, "sdar", out, "train.max_steps=1")
    assert main(["rl", *_yaml(tmp_path), *args]) == 0
    saved = (out / "config.yaml").read_text()
    capsys.readouterr()
    # optim.lr would be recorded but not used (the optimizer resumes at 0.003); algorithm and seed switch runs
    assert main(["rl", *_yaml(tmp_path), *args, "run.resume=latest", "optim.lr=0.005", "algorithm=espo",
                 "run.seed=1"]) == 2
    err = capsys.readouterr().err
    ckpt = out / "checkpoints" / "step-0000001"
    assert err.startswith(f"dllm-rl rl: error: resume from {ckpt}: run.seed 0 -> 1; algorithm 'tracerl' -> 'espo'; ")
    assert "; estimator 'trace' -> 'elbo'; " in err and "; optim.lr 0.003 -> 0.005: these settings cannot change on " \
        "resume (the run would continue as another run, and config.yaml would name values that did not run); " \
        "resume with the checkpoint's values, or start a new run in another run.output_dir. Settings that may " \
        "change: " \
        "run.output_dir, " in err
    assert err.count("\n") == 1
    assert (out / "config.yaml").read_text() == saved  # still says what ran
    assert main(["rl", *_yaml(tmp_path), *args, "run.resume=latest", "train.max_steps=2", "run.save_every=1"]) == 0
    applied = "resume: applied changed settings: run.save_every 0 -> 1; train.max_steps 1 -> 2\n"
    assert applied in capsys.readouterr().out
    assert "  max_steps: 2\n" in (out / "config.yaml").read_text()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_ctrl_c_and_a_full_disk_end_with_one_line(rl_setup, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = rl_overrides(rl_setup, "sdar", out, "train.max_steps=3", "run.save_every=1")
    real_step, calls = RLTrainer.step, []

    def step(self):
        calls.append(self.step_idx)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(RLTrainer, "step", step)
    assert main(["rl", *_yaml(tmp_path), *args]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"dllm-rl rl: interrupted: stopped during step 2 of 3; the last checkpoint is "
                                    f"{out}/checkpoints/step-0000001: continue the run with run.resume=latest")
    assert "Traceback" not in err
    monkeypatch.setattr(RLTrainer, "step", real_step)

    disk_full_at(monkeypatch, out / "checkpoints" / "step-0000002")  # safetensors' error, as a full disk gives it
    assert main(["rl", *_yaml(tmp_path), *args, "run.resume=latest"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"dllm-rl rl: error: no space left on device writing the checkpoint {out}/checkpoints/"
                        r"step-0000002: it needs about \d+\.\d KB, \d+\.\d [KMGT]B free there; free space \(or lower "
                        r"keep_checkpoints\), then resume the run\n", err.splitlines(keepends=True)[-1])
    assert "Traceback" not in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000001"]


def test_a_full_disk_while_final_is_written_ends_with_one_line_and_resume_writes_it(rl_setup, tmp_path, capsys,
                                                                                    monkeypatch):
    out = tmp_path / "run"
    args = rl_overrides(rl_setup, "sdar", out, "train.max_steps=1")
    disk_full_at(monkeypatch, out / "final")  # the checkpoints are written
    assert main(["rl", *_yaml(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"dllm-rl rl: error: no space left on device writing the model {out}/final: it needs about "
                        r"\d+\.\d KB, \d+\.\d [KMGT]B free there; free space, then resume the run "
                        r"\(run.resume=latest\) to write it\n", err.splitlines(keepends=True)[-1])
    assert "Traceback" not in err and not (out / "summary.json").exists()
    monkeypatch.undo()
    assert main(["rl", *_yaml(tmp_path), *args, "run.resume=latest"]) == 0
    assert (out / "final" / "model.safetensors").is_file() and (out / "summary.json").is_file()


def test_tilde_in_the_paths_is_the_home_directory(rl_setup, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("llada", "train.jsonl"):
        (tmp_path / name).symlink_to(rl_setup / name)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", "~/runs/x", "model.path=~/llada",
                                                   "data.train_file=~/train.jsonl"))
    RLTrainer(cfg).close()
    saved = (tmp_path / "runs" / "x" / "config.yaml").read_text()
    assert f"  path: {tmp_path}/llada\n" in saved and f"  output_dir: {tmp_path}/runs/x\n" in saved
    assert f"  train_file: {tmp_path}/train.jsonl\n" in saved
    assert not (tmp_path / "~").exists()


def test_the_last_step_is_saved_once(rl_setup, tmp_path, monkeypatch):
    """With save_every dividing max_steps the loop's checkpoint of the last step is the run's last one (an 8B
    checkpoint written twice costs minutes); otherwise the end of the run writes it."""
    from dllm_rl.rl.loop import train

    saved = []
    real = RLTrainer.save

    def counted(self, *a, **k):
        saved.append(self.step_idx)
        return real(self, *a, **k)

    monkeypatch.setattr(RLTrainer, "save", counted)
    for every, want in ((1, [1, 2]), (0, [2])):
        saved.clear()
        train(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / f"every{every}",
                                                       "train.max_steps=2", f"run.save_every={every}")))
        assert saved == want
