"""Run directories: a file refused, one run at a time (a lock, tested across two processes), no new run mixed
into an old one without resume or overwrite, leftovers of a cut-short save cleaned."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dllm_rl.training.run_dir import MANIFEST, RL_RUN_FILES, RunDirError, open_run_dir

HOLD = ("import sys; from dllm_rl.training.run_dir import RL_RUN_FILES, open_run_dir; "
        "d = open_run_dir(sys.argv[1], RL_RUN_FILES, resume=False, overwrite=False); "
        "print('locked', flush=True); sys.stdin.readline(); d.close()")


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(RunDirError,
                       match=rf"^run.output_dir={f} is a file, not a directory; choose another run.output_dir$"):
        open_run_dir(f, RL_RUN_FILES, resume=False, overwrite=False)


def test_second_process_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirError, match=rf"^run.output_dir={out} is in use by another run \(pid {holder.pid}\), "
                                              rf"which holds {out}/.lock; wait for it to finish or choose another"):
            open_run_dir(out, RL_RUN_FILES, resume=True, overwrite=False)
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    run = open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)  # released when the first ended
    assert (out / ".lock").read_text() == f"{os.getpid()}\n"
    mine = rf"in use by another run \(pid {os.getpid()}\), a trainer of this process not yet closed \(call its close"
    with pytest.raises(RunDirError, match=mine):  # a second run in this very process too
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    run.close()
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False).close()


def test_existing_run_needs_resume_or_overwrite_which_deletes_only_the_run_files(tmp_path, caplog):
    out = tmp_path / "run"
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False).close()  # missing: a fresh start
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False).close()  # empty (but for .lock): too
    (out / "log.txt").write_text("kept")
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False).close()  # other files are no run
    (out / MANIFEST).unlink()  # a run written before run manifests: read conservatively
    (out / "config.yaml").write_text("a: 1\n")
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError, match=rf"^run.output_dir={out} already holds a run \(config.yaml, metrics.jsonl, "
                                          r"checkpoints\); pass run.resume=latest to continue it, "
                                          r"run.overwrite=true to "
                                          r"delete it and start afresh, or choose another run.output_dir$"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    assert (out / "config.yaml").is_file()
    with pytest.raises(RunDirError, match="^run.resume and run.overwrite contradict each other"):
        open_run_dir(out, RL_RUN_FILES, resume=True, overwrite=True)
    open_run_dir(out, RL_RUN_FILES, resume=True, overwrite=False).close()
    assert (out / "checkpoints").is_dir()  # kept for the resume (the empty step folder is a leftover)
    assert not (out / "checkpoints" / "step-0000002").exists()
    assert json.loads((out / MANIFEST).read_text())["files"] == ["config.yaml", "metrics.jsonl"]
    with caplog.at_level("WARNING", logger="dllm_rl.training.run_dir"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True).close()
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, ".lock", "log.txt"]
    assert f"{out / 'metrics.jsonl'}: removed (run.overwrite=true)" in caplog.text
    sft = open_run_dir(out, ("model",), resume=False, overwrite=False, key="run.output_dir",
                       resume_hint="run.resume=auto", overwrite_hint="run.overwrite=true")
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("{}")  # written by the run: recorded when it closes
    sft.close()
    with pytest.raises(RunDirError, match=r"run.output_dir=.* already holds a run \(model\); pass run.resume=auto "
                                          r"to continue it, run.overwrite=true to delete it"):
        open_run_dir(out, ("model",), resume=False, overwrite=False, key="run.output_dir",
                     resume_hint="run.resume=auto", overwrite_hint="run.overwrite=true")


def _write(root, *names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)


def _tree(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir())


RUN = ["config.yaml", "metrics.jsonl", "rollouts.jsonl", "checkpoints/step-0000001/trainer_state.json",
       "checkpoints/step-0000001/model/model.safetensors", "final/config.json", "final/model.safetensors",
       "tensorboard/events.out.1", "mlruns/0/meta.yaml", "dashboard.png"]
USERS = ["mlruns/7/meta.yaml", "tensorboard/mine/events.out.2", "plots/figure.png", "checkpoints/x.pt",
         "final/paper.tex", "notes.txt"]


def test_overwrite_deletes_what_the_run_recorded_and_keeps_the_users_files(tmp_path):
    """A run's files are recorded as it writes them; files put beside them later (or before it) stay."""
    out = tmp_path / "run"
    _write(out, "plots/figure.png")  # there before the run
    run = open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    _write(out, *RUN)
    run.close()
    assert json.loads((out / MANIFEST).read_text()) == {"format": 1, "files": sorted(RUN), "open_session_before": None}
    _write(out, *USERS)  # after it
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True).close()
    assert _tree(out) == sorted([MANIFEST, ".lock", *USERS])
    assert not (out / "final" / "config.json").exists()
    assert (out / "final" / "paper.tex").read_text() == "final/paper.tex"


def test_a_killed_session_is_recorded_by_the_next_that_opens_the_directory(tmp_path):
    out = tmp_path / "run"
    _write(out, "tensorboard/mine/events.out.2")
    run = open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    _write(out, "config.yaml", "metrics.jsonl", "tensorboard/events.out.1", "checkpoints/step-0000001.tmp/a.pt")
    run.lock.close()  # as a SIGKILL leaves it: the lock released, nothing recorded
    run.lock = None
    assert json.loads((out / MANIFEST).read_text())["files"] == []
    with pytest.raises(RunDirError, match=r"holds a run \(config.yaml, metrics.jsonl, checkpoints, tensorboard\)"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True).close()
    assert _tree(out) == [MANIFEST, ".lock", "tensorboard/mine/events.out.2"]


def test_overwrite_of_a_run_without_a_manifest_deletes_only_what_it_can_tell_is_the_runs(tmp_path, caplog):
    """A run directory of a version without manifests: the fixed-name files, checkpoints/step-N and the model
    files of final/ go; everything else stays (named in a log line)."""
    out = tmp_path / "run"
    _write(out, *RUN, *USERS)
    with caplog.at_level("WARNING", logger="dllm_rl.training.run_dir"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True).close()
    assert _tree(out) == sorted([MANIFEST, ".lock", "tensorboard/events.out.1", "mlruns/0/meta.yaml", *USERS])
    assert f"{out}: kept checkpoints/x.pt, final/paper.tex, mlruns/0/meta.yaml, mlruns/7/meta.yaml" in caplog.text


def test_overwrite_refuses_to_delete_the_model_or_data_the_run_starts_from(tmp_path, monkeypatch):
    """model=runs/own/final output_dir=runs/own overwrite=true: refused before anything is deleted, however
    the path is spelled (a link, .., relative, ~)."""
    out = tmp_path / "own"
    _write(out, *RUN)
    (tmp_path / "link").symlink_to(out / "final")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for inputs, shown in [({"model": str(out / "final")}, f"model={out / 'final'}"),
                          ({"model": "link"}, "model=link"),
                          ({"model": "own/checkpoints/../final"}, "model=own/checkpoints/../final"),
                          ({"tokenizer": "~/own/final"}, "tokenizer=~/own/final"),
                          ({"train_data": "own/rollouts.jsonl"}, "train_data=own/rollouts.jsonl"),
                          ({"model": "own/checkpoints/step-0000001/model"},
                           "model=own/checkpoints/step-0000001/model")]:
        with pytest.raises(RunDirError,
                           match=rf"^run.overwrite=true would delete own/\S+, and {shown} lies in or under "
                                              r"it: the run would destroy what it starts from; copy \w+ out of own "
                                              r"first, or choose another run.output_dir$"):
            open_run_dir("own", RL_RUN_FILES, resume=False, overwrite=True, inputs=inputs)
        assert _tree(out) == sorted([".lock", *RUN])
    open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True, inputs={"model": str(tmp_path), "task": "countdown",
                                                                          "eval.data": None}).close()
    assert _tree(out) == [MANIFEST, ".lock", "mlruns/0/meta.yaml", "tensorboard/events.out.1"]  # no manifest: kept


def test_a_dangling_link_or_tilde_output_dir(tmp_path, monkeypatch):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(RunDirError,
                       match=rf"^run.output_dir={link} is a symbolic link to {tmp_path / 'gone'}, which does "
                                          r"not exist; create that directory or choose another run.output_dir$"):
        open_run_dir(link, RL_RUN_FILES, resume=False, overwrite=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    run = open_run_dir("~/runs/x", RL_RUN_FILES, resume=False, overwrite=False)
    run.close()
    assert run.path == tmp_path / "home" / "runs" / "x" and (run.path / ".lock").is_file()
    assert not (tmp_path / "~").exists()


def test_tilde_expansion_keeps_every_key_of_one_section(monkeypatch):
    """Two keys of one section (model.path and model.tokenizer) are both expanded, not only the last one."""
    from dllm_rl.config import load_config
    from dllm_rl.sft.config import SFTConfig
    from dllm_rl.sft.trainer import SFT_PATHS
    from dllm_rl.training.user_paths import expand_user

    monkeypatch.setenv("HOME", "/home/someone")
    cfg = expand_user(load_config(SFTConfig, None, ["model.path=~/m", "model.tokenizer=~/t", "run.output_dir=~/o",
                                                    "run.resume=~/r"]), SFT_PATHS)
    assert (cfg.model.path, cfg.model.tokenizer, cfg.run.output_dir, cfg.run.resume) == (
        "/home/someone/m", "/home/someone/t", "/home/someone/o", "/home/someone/r")
