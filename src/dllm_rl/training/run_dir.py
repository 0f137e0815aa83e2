"""A training run's output directory: one run at a time, never a second run mixed into a first.

:func:`open_run_dir` is called by both trainers before any compute. In order, it

1. refuses an ``output_dir`` that is an existing file;
2. takes an advisory lock (``fcntl.flock`` on ``output_dir/.lock``, which records the holder's pid) held until
   :meth:`RunDir.close` or the process ends, and refuses the directory while another run holds it;
3. refuses to start a new run in an *existing run directory* -- one that holds any of the run's own files
   (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ...: the ``run_files`` the trainer names) --
   unless the run resumes, or ``overwrite`` is set, which first deletes exactly those files (nothing else:
   a ``log.txt`` beside them stays). An empty or missing directory is a fresh start;
4. deletes what is not a complete checkpoint under ``checkpoints/`` (a save cut short by a kill), with a log
   line.

Only the main rank calls it (the others wait at a barrier in the trainer). Errors are :class:`RunDirError`
(a :class:`~dllm_rl.errors.UserError`: the command line prints its one line and exits 2).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dllm_rl.errors import UserError
from dllm_rl.training.checkpoint import clean_leftovers

logger = logging.getLogger(__name__)
LOCK_FILE = ".lock"
# what each trainer writes into its run directory (any of them there = an existing run; overwrite deletes them)
RL_RUN_FILES = ("config.yaml", "metrics.jsonl", "rollouts.jsonl", "summary.json", "checkpoints", "final", "plots",
                "dashboard.png", "tensorboard", "mlruns")
SFT_RUN_FILES = ("config.yaml", "metrics.jsonl", "data_report.json", "checkpoints", "model", "plots", "dashboard.png",
                 "tensorboard", "mlruns")


class RunDirError(UserError):
    """An output directory that this run may not use (the message says why and what to do)."""


@dataclass
class RunDir:
    """An output directory locked for this run; :meth:`close` (or the end of the process) releases it."""

    path: Path
    lock: IO[str] | None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing the descriptor releases the flock
            self.lock = None


def _lock(path: Path, key: str) -> IO[str]:
    f = (path / LOCK_FILE).open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        who = f" (pid {holder})" if holder.isdigit() else ""
        if holder == str(os.getpid()):  # an earlier trainer of this very process still holds it
            who += ", a trainer of this process not yet closed (call its close())"
        raise RunDirError(f"{key}={path} is in use by another run{who}, which holds {path / LOCK_FILE}; wait for "
                          f"it to finish or choose another {key}") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def existing_run_files(path: Path, run_files: tuple[str, ...]) -> list[str]:
    """Which of ``run_files`` (names of files or folders a run writes) ``path`` already holds."""
    return [name for name in run_files if (path / name).exists()]


def open_run_dir(path: str | Path, run_files: tuple[str, ...], *, resume: bool, overwrite: bool,
                 key: str = "output_dir", resume_hint: str = "resume=latest",
                 overwrite_hint: str = "overwrite=true") -> RunDir:
    """Check, lock and prepare the run directory ``path`` (see the module docstring).

    ``key`` / ``resume_hint`` / ``overwrite_hint``: the config key and settings the messages name
    (``train.output_dir``, ``train.resume=auto``, ``train.overwrite=true`` for SFT)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{key}={path} is a file, not a directory; choose another {key}")
    if resume and overwrite:
        raise RunDirError(f"{resume_hint.split('=')[0]} and {overwrite_hint.split('=')[0]} contradict each other: "
                          "resume continues the run in the directory, overwrite deletes it; give one")
    path.mkdir(parents=True, exist_ok=True)
    lock = _lock(path, key)
    try:
        found = existing_run_files(path, run_files)
        if found and not resume:
            if not overwrite:
                raise RunDirError(
                    f"{key}={path} already holds a run ({', '.join(found)}); pass {resume_hint} to continue it, "
                    f"{overwrite_hint} to delete it and start afresh, or choose another {key}")
            for name in found:
                target = path / name
                logger.warning("%s: removed (%s)", target, overwrite_hint)
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
        clean_leftovers(path)
    except BaseException:
        lock.close()
        raise
    return RunDir(path, lock)
