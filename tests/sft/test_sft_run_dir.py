"""The SFT run directory: a real run killed while it writes a checkpoint resumes with run.resume=auto; an
old run is refused without run.resume / run.overwrite, and run.overwrite starts afresh."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from full_disk import disk_full_at

from dllm_rl.cli import main
from dllm_rl.config import load_config
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.trainer import SFTTrainer
from dllm_rl.training import RunDirError
from dllm_rl.training.checkpoint import KILL_ENV

ROWS = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(4) for b in range(3)]


def _overrides(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return ["model.tokenizer=char", "model.alphabet=0123456789+=", "model.hidden_size=32", "model.num_layers=1",
            "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=64", f"data.train_file={data}",
            "data.max_length=16", "train.micro_batch_size=4", "train.max_steps=3", "run.progress=false",
            f"run.output_dir={tmp_path / 'run'}", "train.log_every=1", "run.save_every=1",
            "run.keep_checkpoints=3", "train.num_threads=1"]


def _sft(args, **env):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, "-m", "dllm_rl", "sft", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_run_killed_while_writing_a_checkpoint_resumes_with_resume_auto(tmp_path):
    args = _overrides(tmp_path)
    out = tmp_path / "run"
    killed = _sft(args, **{KILL_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002.tmp"]
    assert (ckpts / "step-0000002.tmp" / "trainer_state.json").is_file()
    with pytest.raises(RunDirError, match=rf"run.output_dir={out} already holds a run .*pass run.resume=latest"):
        SFTTrainer(load_config(SFTConfig, None, args), verbose=False)

    resumed = _sft([*args, "run.resume=auto"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"sft: resumed from {ckpts / 'step-0000001'} at step 1" in resumed.stdout
    assert f"{ckpts / 'step-0000002.tmp'}: not a complete checkpoint (a save cut short?); removed" in resumed.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001", "step-0000002", "step-0000003"]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (out / "model" / "model.safetensors").is_file()

    (out / "notes.txt").write_text("kept")
    again = SFTTrainer(load_config(SFTConfig, None, [*args, "run.overwrite=true", "train.max_steps=1"]),
                       verbose=False)
    again.run()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000001"]
    assert (out / "notes.txt").read_text() == "kept"


def test_tilde_paths_resume_checks_and_overwrite_that_would_delete_the_model(tmp_path, monkeypatch, capsys):
    """~ is the home directory; a resume refuses changed settings that make another run (config.yaml still says
    what ran) and applies train.max_steps; overwrite refuses to delete model.path."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    args = [a for a in _overrides(home) if not a.startswith(("data.train_file=", "run.output_dir="))]
    args += ["data.train_file=~/train.jsonl", "run.output_dir=~/run", "train.max_steps=1"]
    out = home / "run"
    assert main(["sft", *args]) == 0
    assert (out / "model" / "model.safetensors").is_file() and not (tmp_path / "~").exists()
    saved = (out / "config.yaml").read_text()
    assert f"output_dir: {out}\n" in saved and f"train_file: {home}/train.jsonl\n" in saved
    capsys.readouterr()
    assert main(["sft", *args, "run.resume=auto", "optim.lr=0.01", "run.seed=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dllm-rl sft: error: resume from {out}/checkpoints/step-0000001: run.seed 0 -> 3; "
                          "optim.lr 1e-05 -> 0.01: these settings cannot change on resume")
    assert (out / "config.yaml").read_text() == saved
    assert main(["sft", *args, "run.resume=auto", "train.max_steps=2"]) == 0
    assert "sft: resume: applied changed settings: train.max_steps 1 -> 2\n" in capsys.readouterr().out
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert main(["sft", *args, "model.path=~/run/model", "run.overwrite=true"]) == 2
    assert capsys.readouterr().err == (
        f"dllm-rl sft: error: run.overwrite=true would delete {out}/model/config.json, and model.path={out}/model "
        f"lies in or under it: the run would destroy what it starts from; copy model.path out of {out} first, or "
        "choose another run.output_dir\n")
    assert (out / "model" / "model.safetensors").is_file()


def test_ctrl_c_prints_one_line_with_the_step_and_how_to_resume(tmp_path, monkeypatch, capsys):
    real, calls = SFTTrainer.train_step, []

    def train_step(self):
        calls.append(self.step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(SFTTrainer, "train_step", train_step)
    assert main(["sft", *_overrides(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (f"dllm-rl sft: interrupted: stopped during step 3 of 3; the last checkpoint is "
                                    f"{tmp_path}/run/checkpoints/step-0000002: continue the run with "
                                    "run.resume=latest")
    assert "Traceback" not in err


def test_a_full_disk_while_model_is_written_ends_with_one_line_and_resume_writes_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    disk_full_at(monkeypatch, out / "model")  # the checkpoints are written
    args = [*_overrides(tmp_path), "train.max_steps=1"]
    assert main(["sft", *args]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"dllm-rl sft: error: no space left on device writing the model {out}/model: it needs "
                        r"about \d+\.\d KB, \d+\.\d [KMGT]B free there; free space, then resume the run "
                        r"\(run.resume=latest\) to write it\n", err.splitlines(keepends=True)[-1])
    assert "Traceback" not in err
    monkeypatch.undo()
    assert main(["sft", *args, "run.resume=latest"]) == 0
    assert (out / "model" / "model.safetensors").is_file()


def test_a_finite_absurd_learning_rate_stops_with_one_line_naming_the_step_and_the_lr(tmp_path, capsys):
    """optim.lr=1e10 passes the config's check; step 1's update throws the weights to about 1e10 (step 2's loss
    was NaN and its update's weights NaN, where the run used to stop), and the weight check (training/finite.py)
    stops the run there: one line naming the norms and the learning rate, exit 2, no model/."""
    assert main(["sft", *_overrides(tmp_path), "optim.lr=1e10"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"dllm-rl sft: error: sft: stopping at step 1: the model's weights' norm grew from [\d.]+ to "
                        r"[\d.]+e\+1\d \(x[\d.]+e\+\d\d\) in one update at optim.lr=1e\+10 \(the guard stops a change "
                        r"beyond x2 or x0\.5\); model/ is not written\. Lower the learning rate \(optim.lr\) and start "
                        r"again, or resume from an earlier checkpoint", err.splitlines()[-1]), err
    assert "Traceback" not in err and not (tmp_path / "run" / "model").exists()


def test_a_full_disk_during_a_checkpoint_ends_with_one_line_and_the_last_checkpoint_stays(tmp_path, monkeypatch,
                                                                                          capsys):
    """The disk fills up while step 2's optimizer.pt is written (torch's writer: RuntimeError, the ENOSPC in its
    chain): one line, exit 2, step 1 whole and no step-2 leftover; resuming after that finishes the run."""
    out = tmp_path / "run"
    disk_full_at(monkeypatch, out / "checkpoints" / "step-0000002", names=("optimizer.pt",))
    args = _overrides(tmp_path)
    assert main(["sft", *args]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"dllm-rl sft: error: no space left on device writing the checkpoint {out}/checkpoints/"
                        r"step-0000002: it needs about \d+\.\d KB, \d+\.\d [KMGT]B free there; free space \(or lower "
                        r"keep_checkpoints\), then resume the run\n", err)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000001"]
    monkeypatch.undo()
    assert main(["sft", *args, "run.resume=latest"]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000001", "step-0000002", "step-0000003"]


def test_a_truncated_checkpoint_is_refused_by_name_and_passed_over_by_latest(tmp_path, capsys, caplog):
    """The last checkpoint's weights cut short: resuming it by name is one line naming the file (exit 2);
    run.resume=latest resumes the one before with one warning naming the file."""
    args = _overrides(tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    assert main(["sft", *args]) == 0
    capsys.readouterr()
    file = ckpts / "step-0000003" / "model" / "model.safetensors"
    size = file.stat().st_size
    file.write_bytes(file.read_bytes()[:1000])  # a copy cut short
    assert main(["sft", *args, f"run.resume={ckpts / 'step-0000003'}", "train.max_steps=4"]) == 2
    assert capsys.readouterr().err == (
        f"dllm-rl sft: error: {file} is truncated (1000 of its {size} bytes): the checkpoint {ckpts / 'step-0000003'} "
        "cannot be resumed; resume from an earlier checkpoint (run.resume=latest takes the newest intact one)\n")
    with caplog.at_level("WARNING", logger="dllm_rl.training.checkpoint"):
        assert main(["sft", *args, "run.resume=latest", "train.max_steps=4"]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"{file} is truncated (1000 of its {size} bytes): the checkpoint {ckpts / 'step-0000003'} is skipped; the "
        f"newest intact checkpoint is {ckpts / 'step-0000002'}"]
    assert f"sft: resumed from {ckpts / 'step-0000002'} at step 2" in capsys.readouterr().out
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in metrics] == [1, 2, 3, 4]
    assert file.stat().st_size == size  # step 3 written again, whole
