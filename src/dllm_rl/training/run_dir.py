"""A training run's output directory: one run at a time, never a second run mixed into a first, and never a
file deleted that the run did not write.

:func:`open_run_dir` is called by both trainers before any compute. In order, it

1. refuses an ``output_dir`` that is an existing file, or a symbolic link to nothing;
2. takes an advisory lock (``fcntl.flock`` on ``output_dir/.lock``, which records the holder's pid) held until
   :meth:`RunDir.close` or the process ends, and refuses the directory while another run holds it;
3. refuses to start a new run in an *existing run directory* -- one that holds files of a run -- unless the
   run resumes, or ``overwrite`` is set, which first deletes exactly those files (see below);
4. deletes the leftovers of a checkpoint save cut short under ``checkpoints/``, with a log line.

Which files are a run's: the run records them in a manifest, ``output_dir/.dllm-rl-run.json``. A session
lists the files under the trainer's ``run_files`` names when it opens the directory (``before``) and, at each
checkpoint and when it closes, adds those that appeared since; a session killed before it could record is
recorded by the next one that opens the directory. ``overwrite`` deletes the recorded files, the files the
trainer writes at fixed names (``config.yaml``, ``metrics.jsonl``, ...: it would overwrite them anyway) and
the folders this leaves empty -- nothing else: a user's ``tensorboard/`` logs, ``checkpoints/x.pt`` or
``final/paper.tex`` stay, with a log line naming them. A directory written before manifests existed (no
manifest) is read conservatively: only the fixed-name files, ``checkpoints/step-N`` folders and the model
files of ``final/`` / ``model/`` count as the run's.

``overwrite`` also refuses, before deleting anything, when an input of the run (the model, its tokenizer,
the data) lies in or under what it would delete (paths resolved: ``~``, ``..``, symbolic links).

Only the main rank calls it (the others wait at a barrier in the trainer). Errors are :class:`RunDirError`
(a :class:`~dllm_rl.errors.UserError`: the command line prints its one line and exits 2).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dllm_rl.errors import UserError
from dllm_rl.training.checkpoint import LEFTOVER_NAME, clean_leftovers, latest_checkpoint

logger = logging.getLogger(__name__)
LOCK_FILE = ".lock"
MANIFEST = ".dllm-rl-run.json"
# what each trainer writes into its run directory (overwrite deletes what of them the run wrote)
RL_RUN_FILES = ("config.yaml", "metrics.jsonl", "rollouts.jsonl", "summary.json", "checkpoints", "final", "plots",
                "dashboard.png", "tensorboard", "mlruns")
SFT_RUN_FILES = ("config.yaml", "metrics.jsonl", "data_report.json", "checkpoints", "model", "plots", "dashboard.png",
                 "tensorboard", "mlruns")
# files a trainer writes at these exact names (a file there is replaced by the run whatever wrote it)
FIXED_FILES = ("config.yaml", "metrics.jsonl", "rollouts.jsonl", "summary.json", "data_report.json", "dashboard.png")
MODEL_DIRS = ("final", "model")
# a run directory without a manifest: the files of final/ / model/ that a run of this library wrote
_LEGACY_MODEL_FILE = re.compile(r"config\.json|generation_config\.json|model.*\.safetensors(\.index\.json)?|"
                                r"tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab.*|merges\.txt|"
                                r"chat_template.*")


class RunDirError(UserError):
    """An output directory that this run may not use (the message says why and what to do)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message names the step and how to resume (the command line prints it as one
    line and exits 130). A ``KeyboardInterrupt``, so code that catches that keeps working."""


def interrupted(out: Path, step: int, total: int, resume_hint: str, overwrite_hint: str) -> RunInterrupted:
    """The :class:`RunInterrupted` of a run stopped during step ``step + 1`` (``step`` steps done)."""
    last = latest_checkpoint(out)
    where = (f"the last checkpoint is {last}: continue the run with {resume_hint}" if last is not None else
             f"no checkpoint was saved yet: start it again with {overwrite_hint}")
    return RunInterrupted(f"stopped during step {min(step + 1, total)} of {total}; {where}")


@dataclass
class RunDir:
    """An output directory locked for this run; :meth:`record` adds what the run wrote since it opened to the
    manifest; :meth:`close` (or the end of the process) records and releases it."""

    path: Path
    lock: IO[str] | None
    run_files: tuple[str, ...] = ()
    before: set[str] = field(default_factory=set)

    def record(self, closing: bool = False) -> None:
        """Add the files that appeared under ``run_files`` since the run opened the directory to its manifest
        (``closing``: and mark the session closed)."""
        if self.lock is None:
            return
        manifest = _read_manifest(self.path) or {}
        now = _files(self.path, self.run_files)
        files = (set(manifest.get("files", [])) | (now - self.before)) & now
        _write_manifest(self.path, sorted(files), None if closing else sorted(self.before))

    def close(self) -> None:
        if self.lock is not None:
            try:
                self.record(closing=True)
            except OSError as exc:  # a full disk must not hide the error that ended the run
                logger.warning("%s: the run's file record was not updated (%s)", self.path / MANIFEST, exc)
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


def _files(path: Path, run_files: Iterable[str]) -> set[str]:
    """Every file (and symbolic link) under the ``run_files`` names of ``path``, relative, in POSIX form."""
    found: set[str] = set()
    for name in run_files:
        top = path / name
        if top.is_symlink() or top.is_file():
            found.add(name)
        elif top.is_dir():
            for dirpath, dirnames, filenames in os.walk(top):
                rel = Path(dirpath).relative_to(path)
                found.update((rel / n).as_posix() for n in filenames)
                found.update((rel / d).as_posix() for d in dirnames if (Path(dirpath) / d).is_symlink())
    return found


def _read_manifest(path: Path) -> dict | None:
    try:
        data = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path / MANIFEST}: the record of the run's files is unreadable ({exc}); delete the run's "
                          "files yourself (and this record), or choose another output_dir") from None
    return data if isinstance(data, dict) else {}


def _write_manifest(path: Path, files: list[str], before: list[str] | None) -> None:
    """Write the manifest atomically; ``before`` (the files of an open session from before it began) is None
    once the session closed."""
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"format": 1, "files": files, "open_session_before": before}, indent=1) + "\n")
    os.replace(tmp, path / MANIFEST)


def _legacy_units(path: Path, run_files: Iterable[str]) -> set[str]:
    """What counts as a run's in a directory without a manifest (written before manifests existed)."""
    units: set[str] = set()
    for name in run_files:
        top = path / name
        if top.is_symlink():  # never delete through a link
            continue
        if name == "checkpoints" and top.is_dir():
            units.update(f"{name}/{p.name}" for p in top.iterdir() if LEFTOVER_NAME.fullmatch(p.name))
        elif name in MODEL_DIRS and top.is_dir():
            units.update(f"{name}/{p.name}" for p in top.iterdir()
                         if p.is_file() and _LEGACY_MODEL_FILE.fullmatch(p.name))
    return units


def run_units(path: Path, run_files: tuple[str, ...]) -> list[str]:
    """The run's files (and, without a manifest, ``checkpoints/step-N`` folders) in ``path``: what overwrite
    deletes. A session that never closed (killed) is recorded first."""
    manifest = _read_manifest(path)
    fixed = {name for name in run_files if name in FIXED_FILES and ((path / name).is_file()
                                                                   or (path / name).is_symlink())}
    if manifest is None:
        units = fixed | _legacy_units(path, run_files)
    else:
        now = _files(path, run_files)
        recorded = set(manifest.get("files", []))
        if manifest.get("open_session_before") is not None:  # killed: what it wrote is what appeared since
            recorded |= now - set(manifest["open_session_before"])
        units = fixed | (recorded & now)
    order = {name: i for i, name in enumerate(run_files)}
    return sorted(units, key=lambda u: (order.get(u.split("/")[0], len(order)), u))


def _expand(path: Path, units: Iterable[str]) -> set[str]:
    """The files of ``units`` (a folder unit: every file under it)."""
    files: set[str] = set()
    for unit in units:
        target = path / unit
        if target.is_dir() and not target.is_symlink():
            files.update(Path(dirpath, n).relative_to(path).as_posix()
                         for dirpath, _, names in os.walk(target) for n in names)
        else:
            files.add(unit)
    return files


def _resolved(p: Path) -> Path:
    """``p`` with ``~``, ``..`` and the symbolic links of its folders resolved (not a link at ``p`` itself)."""
    p = Path(os.path.abspath(p.expanduser()))
    return p.parent.resolve() / p.name


def _refuse_deleting_inputs(path: Path, units: list[str], inputs: Mapping[str, str | None], key: str,
                            overwrite_hint: str) -> None:
    """Refuse before deleting anything when an input of the run lies in or under what would be deleted, or
    when it is a folder in the run directory that holds files to be deleted (``final/``'s config.json)."""
    for name, value in inputs.items():
        if not value or not Path(value).expanduser().exists():  # unset, or a hub id
            continue
        inp = Path(value).expanduser().resolve()
        inside = inp == path.resolve() or path.resolve() in inp.parents  # an input folder in the run directory
        for unit in units:
            target = _resolved(path / unit)
            if inp == target or target in inp.parents or inside and inp in target.parents:
                raise RunDirError(
                    f"{overwrite_hint} would delete {path / unit}, and {name}={value} lies in or under it: the run "
                    f"would destroy what it starts from; copy {name} out of {path} first, or choose another {key}")


def _delete(path: Path, units: list[str], run_files: tuple[str, ...], overwrite_hint: str) -> None:
    """Delete ``units`` (files, links, legacy checkpoint folders), then the folders this leaves empty and the
    empty folders of the run's names."""
    emptied = {path / name for name in run_files}
    for unit in units:
        target = path / unit
        logger.warning("%s: removed (%s)", target, overwrite_hint)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
        emptied.update(p for p in target.parents if path in p.parents)
    for folder in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()


def _check_path(path: Path, key: str) -> Path:
    """``path`` with ``~`` expanded, refused when it is a file or a link to nothing, created when missing."""
    path = path.expanduser()
    if path.is_symlink() and not path.exists():
        raise RunDirError(f"{key}={path} is a symbolic link to {os.readlink(path)}, which does not exist; create "
                          f"that directory or choose another {key}")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{key}={path} is a file, not a directory; choose another {key}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"{key}={path}: cannot create the directory ({exc.strerror}); choose another {key}") from None
    return path


def open_run_dir(path: str | Path, run_files: tuple[str, ...], *, resume: bool, overwrite: bool,
                 key: str = "run.output_dir", resume_hint: str = "run.resume=latest",
                 overwrite_hint: str = "run.overwrite=true", inputs: Mapping[str, str | None] | None = None) -> RunDir:
    """Check, lock and prepare the run directory ``path`` (see the module docstring).

    ``key`` / ``resume_hint`` / ``overwrite_hint``: the config key and settings the messages name (the shared
    run section's). ``inputs``: the run's input paths by config key (``{"model.path": ..., "data.train_file":
    ...}``), which ``overwrite`` must not delete."""
    if resume and overwrite:
        raise RunDirError(f"{resume_hint.split('=')[0]} and {overwrite_hint.split('=')[0]} contradict each other: "
                          "resume continues the run in the directory, overwrite deletes it; give one")
    path = _check_path(Path(path), key)
    lock = _lock(path, key)
    try:
        units = run_units(path, run_files)
        if units and not resume:
            if not overwrite:
                found = list(dict.fromkeys(u.split("/")[0] for u in units))
                raise RunDirError(
                    f"{key}={path} already holds a run ({', '.join(found)}); pass {resume_hint} to continue it, "
                    f"{overwrite_hint} to delete it and start afresh, or choose another {key}")
            _refuse_deleting_inputs(path, units, inputs or {}, key, overwrite_hint)
            _delete(path, units, run_files, overwrite_hint)
            kept = sorted(_files(path, run_files))
            if kept:
                more = f" and {len(kept) - 10} more" if len(kept) > 10 else ""
                logger.warning("%s: kept %s%s (not recorded as written by a run here)", path, ", ".join(kept[:10]),
                               more)
        clean_leftovers(path)
        before = _files(path, run_files)
        # resumed: the run's files so far (a run from before manifests: as far as they can be told)
        ours = _expand(path, run_units(path, run_files)) & before if resume else set()
        _write_manifest(path, sorted(ours), sorted(before))
    except BaseException:
        lock.close()
        raise
    return RunDir(path, lock, run_files, before)
