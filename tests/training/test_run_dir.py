"""Run directories: a file refused, one run at a time (a lock, tested across two processes), no new run mixed
into an old one without resume or overwrite, leftovers of a cut-short save cleaned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dllm_rl.training.run_dir import RL_RUN_FILES, RunDirError, open_run_dir

HOLD = ("import sys; from dllm_rl.training.run_dir import RL_RUN_FILES, open_run_dir; "
        "d = open_run_dir(sys.argv[1], RL_RUN_FILES, resume=False, overwrite=False); "
        "print('locked', flush=True); sys.stdin.readline(); d.close()")


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "out"
    f.write_text("x")
    with pytest.raises(RunDirError, match=rf"^output_dir={f} is a file, not a directory; choose another output_dir$"):
        open_run_dir(f, RL_RUN_FILES, resume=False, overwrite=False)


def test_second_process_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirError, match=rf"^output_dir={out} is in use by another run \(pid {holder.pid}\), "
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
    (out / "config.yaml").write_text("a: 1\n")
    (out / "checkpoints" / "step-0000002").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError, match=rf"^output_dir={out} already holds a run \(config.yaml, metrics.jsonl, "
                                          r"checkpoints\); pass resume=latest to continue it, overwrite=true to "
                                          r"delete it and start afresh, or choose another output_dir$"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=False)
    assert (out / "config.yaml").is_file()
    with pytest.raises(RunDirError, match="^resume and overwrite contradict each other"):
        open_run_dir(out, RL_RUN_FILES, resume=True, overwrite=True)
    open_run_dir(out, RL_RUN_FILES, resume=True, overwrite=False).close()
    assert (out / "checkpoints").is_dir()  # kept for the resume (the empty step folder is a leftover)
    assert not (out / "checkpoints" / "step-0000002").exists()
    with caplog.at_level("WARNING", logger="dllm_rl.training.run_dir"):
        open_run_dir(out, RL_RUN_FILES, resume=False, overwrite=True).close()
    assert sorted(p.name for p in out.iterdir()) == [".lock", "log.txt"]
    assert f"{out / 'metrics.jsonl'}: removed (overwrite=true)" in caplog.text
    sft = open_run_dir(out, ("model",), resume=False, overwrite=False, key="train.output_dir",
                       resume_hint="train.resume=auto", overwrite_hint="train.overwrite=true")
    sft.close()
    (out / "model").mkdir()
    with pytest.raises(RunDirError, match=r"train.output_dir=.* already holds a run \(model\); pass train.resume=auto "
                                          r"to continue it, train.overwrite=true to delete it"):
        open_run_dir(out, ("model",), resume=False, overwrite=False, key="train.output_dir",
                     resume_hint="train.resume=auto", overwrite_hint="train.overwrite=true")
