"""Exact checkpoint / resume: weights in the published layout, optimizer, scheduler, every RNG, data position.

A checkpoint directory::

    model/                      published layout (config.json + safetensors [+ tokenizer]); LoRA merged
    adapter/                    LoRA only: peft adapter_config.json + adapter_model.safetensors
    optimizer.pt                optimizer.state_dict()            (when an optimizer is given)
    scheduler.pt                scheduler.state_dict()            (when a scheduler is given)
    ema.pt                      WeightEMA.state_dict()            (when a weight average is given)
    rng_state_rank{R}.pt        python / numpy / torch / cuda RNG + named torch.Generators, one per rank
    trainer_state.json          {"step", "data_state", "extra", "world_size", "lora", "format", "files"}:
                                "files" lists every other file with its size (relative path -> bytes)
    config.yaml                 the run's resolved config (when given)
    sharded/                    FSDP2 / DeepSpeed only: accelerator.save_state (model + optimizer shards);
                                optimizer.pt is then not written

``model/`` loads with :func:`dllm_rl.models.load_model` like any published checkpoint.

Atomic: the directory is written as ``step-NNNNNNN.tmp``, ``trainer_state.json`` last, every file and the
folder fsync'ed, then renamed to ``step-NNNNNNN``. A *complete* checkpoint is a folder whose name matches
``step-<digits>`` exactly and whose state file parses; :func:`list_checkpoints` / :func:`latest_checkpoint`
see only those, and :func:`clean_leftovers` deletes the other ``step-<digits>[.old][.tmp]`` entries under
``checkpoints/`` (what a kill during a save leaves; any other name there is not ours and stays). A disk that
fills up during a save ends it with a :class:`DiskFullError` naming the folder, the size needed and the free
space, the temporary folder removed; so does one that fills up while a run writes its published model (RL's
``final/``, SFT's ``model/``: :func:`save_published`). :mod:`~dllm_rl.training.disk_full` tells a full disk from
other failures however the writer reports it (safetensors, torch, Python).

Intact: a complete checkpoint can still be damaged after its save (a copy cut short, a disk error).
:func:`checkpoint_defect` compares each file's size with the state file's list (no tensor is read; a checkpoint
saved before the list: safetensors headers and zip end records); :func:`latest_checkpoint` passes a damaged one
over with one warning naming the file, and :func:`load_checkpoint` refuses it with a
:class:`CorruptCheckpointError` naming the file (as it does a file its library cannot parse).
Fault injection for tests: with ``DLLM_RL_TEST_KILL_IN_CHECKPOINT=N`` in the
environment, the process SIGKILLs itself while saving step N, after the state file and before the rename.

One file on purpose (about 510 lines): it owns one on-disk format. Saving, loading, checking, naming, listing,
pruning and the clean-up of a save cut short all read the same layout and the same rule (a checkpoint is
complete only once its temporary directory was renamed into place, intact while its files have the sizes its
state file lists), so a change of the format is one file's change.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import signal
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from dllm_rl.config import save_config
from dllm_rl.errors import UserError
from dllm_rl.jsonl import fsync_path
from dllm_rl.models import DiffusionLM, save_model
from dllm_rl.training.backend import is_sharded, publishable
from dllm_rl.training.disk_full import DiskFullError, disk_full_error, is_disk_full, torch_save
from dllm_rl.training.ema import WeightEMA
from dllm_rl.training.lora import has_lora, load_adapter_weights, merged_model, save_adapter

logger = logging.getLogger(__name__)
FORMAT = 1
STATE_FILE = "trainer_state.json"
SHARDED_DIR = "sharded"
EMA_FILE = "ema.pt"
CHECKPOINT_NAME = re.compile(r"step-(\d+)")
LEFTOVER_NAME = re.compile(r"step-\d+(\.old)?(\.tmp)?")  # what a save (or a kill during one) may leave
KILL_ENV = "DLLM_RL_TEST_KILL_IN_CHECKPOINT"


@dataclass
class TrainerState:
    """What :func:`load_checkpoint` hands back: the step to continue from and the saved data position."""

    step: int = 0
    data_state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def capture_rng(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state: python ``random``, numpy's global RNG, torch CPU (+ all CUDA devices), and ``generators``."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    """Inverse of :func:`capture_rng`; every name in ``generators`` must be present in ``state``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise UserError(f"checkpoint has no state for generator {name!r} (saved: {sorted(saved)})")
        g.set_state(saved[name])


def _rank_world(accelerator) -> tuple[int, int, bool]:
    if accelerator is None:
        return 0, 1, True
    return accelerator.process_index, accelerator.num_processes, accelerator.is_main_process


def save_checkpoint(
    directory: str | Path,
    dlm: DiffusionLM,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    step: int = 0,
    data_state: dict[str, Any] | None = None,
    generators: dict[str, torch.Generator] | None = None,
    tokenizer: Any = None,
    config: Any = None,
    extra: dict[str, Any] | None = None,
    accelerator: Any = None,
    ema: WeightEMA | None = None,
    extra_files: dict[str, Callable[[Path], Any]] | None = None,
    prepared: torch.nn.Module | None = None,
) -> Path:
    """Write a complete checkpoint of a training run to ``directory`` (see the module docstring).

    ``dlm`` is the unwrapped model (``accelerator.unwrap_model``). With an ``accelerator`` every rank must
    call this (each writes its RNG state; the main process writes the rest). Under FSDP2 / DeepSpeed
    (``prepared``: the module ``accelerator.prepare`` returned) the model and optimizer shards go through
    ``accelerator.save_state`` into ``sharded/`` and ``model/`` is gathered to rank 0.
    ``extra_files`` (``{name: write}``): more files of the checkpoint (e.g. an RL value model), each written by
    ``write(path)`` on the main process into the temporary folder, so before the state file and the rename.
    """
    directory = Path(directory)
    rank, world, main = _rank_world(accelerator)
    tmp = directory.with_name(directory.name + ".tmp")
    try:
        if main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        if accelerator is not None:
            accelerator.wait_for_everyone()
        lora = has_lora(dlm)
        sharded = is_sharded(accelerator)
        plain = publishable(accelerator, prepared if prepared is not None else dlm.model, dlm)  # collective
        if sharded:
            accelerator.save_state(str(tmp / SHARDED_DIR))
        if main:
            _write_main_files(tmp, plain, lora, tokenizer, None if sharded else optimizer, scheduler, ema, config,
                              extra_files)
        torch_save(capture_rng(generators), tmp / f"rng_state_rank{rank}.pt")
        if accelerator is not None:
            accelerator.wait_for_everyone()
        if main:  # the state file last: a folder with it holds everything else
            meta = {"format": FORMAT, "step": int(step), "data_state": data_state or {}, "extra": extra or {},
                    "world_size": world, "lora": lora, "sharded": sharded, "files": _file_sizes(tmp)}
            (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            _fsync_tree(tmp)
            if os.environ.get(KILL_ENV) == str(int(step)):
                os.kill(os.getpid(), signal.SIGKILL)
            _replace_dir(tmp, directory)
        if accelerator is not None:
            accelerator.wait_for_everyone()
    except Exception as exc:
        if not is_disk_full(exc, tmp):
            raise
        raise _disk_full(directory, tmp, dlm, optimizer) from None
    return directory


def _disk_full(directory: Path, tmp: Path, dlm: DiffusionLM, optimizer: Any) -> DiskFullError:
    """Remove what was written of the checkpoint (space back, no leftover) and say how much one needs: the
    newest complete checkpoint's size, else the model's and the optimizer's tensors."""
    shutil.rmtree(tmp, ignore_errors=True)
    done = sorted((step, p) for p in directory.parent.iterdir() if (step := checkpoint_step(p)) is not None) \
        if directory.parent.is_dir() else []
    if done:
        need = sum(f.stat().st_size for f in done[-1][1].rglob("*") if f.is_file())
    else:
        tensors = list(dlm.model.state_dict().values())
        if optimizer is not None:
            tensors += [t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
        need = sum(t.numel() * t.element_size() for t in tensors)
    return disk_full_error("the checkpoint", directory, need,
                           "free space (or lower keep_checkpoints), then resume the run")


def save_published(dlm: DiffusionLM, path: Path, tokenizer: Any = None, resume_hint: str = "run.resume=latest") -> Path:
    """:func:`~dllm_rl.models.save_model` for a run's published model (RL's ``final/``, SFT's ``model/``): a full
    disk ends in a :class:`DiskFullError` naming the folder, the size needed and ``resume_hint`` (the last
    checkpoint is already written: resuming only writes the model again), the partial weights removed so that the
    folder is never read as a whole model."""
    try:
        return save_model(dlm, path, tokenizer=tokenizer)
    except Exception as exc:
        if not is_disk_full(exc, path):
            raise
        for partial in Path(path).glob("model*.safetensors*"):
            partial.unlink()
        need = sum(t.numel() * t.element_size() for t in dlm.model.state_dict().values())
        raise disk_full_error("the model", Path(path), need,
                              f"free space, then resume the run ({resume_hint}) to write it") from None


def _write_main_files(tmp: Path, plain: DiffusionLM, lora: bool, tokenizer: Any, optimizer: Any, scheduler: Any,
                      ema: WeightEMA | None, config: Any, extra_files: dict[str, Callable[[Path], Any]] | None) -> None:
    """What the main process writes into the temporary folder (``optimizer`` None: sharded, in ``sharded/``)."""
    save_model(merged_model(plain) if lora else plain, tmp / "model", tokenizer=tokenizer)
    if lora:
        save_adapter(plain, tmp / "adapter")
    if optimizer is not None:
        torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
    if scheduler is not None:
        torch_save(scheduler.state_dict(), tmp / "scheduler.pt")
    if ema is not None:
        ema.save(tmp / EMA_FILE)
    if config is not None:
        save_config(config, tmp / "config.yaml")
    for name, write in (extra_files or {}).items():
        write(tmp / name)


def _file_sizes(root: Path) -> dict[str, int]:
    """Every file under ``root`` (relative, POSIX) with its size: the state file's list that
    :func:`checkpoint_defect` checks a checkpoint against."""
    return {f.relative_to(root).as_posix(): f.stat().st_size for f in sorted(root.rglob("*")) if f.is_file()}


def _fsync_tree(root: Path) -> None:
    """Every file under ``root``, then every folder (deepest first), forced to disk."""
    folders = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        folders += [Path(dirpath) / d for d in dirnames]
        for name in filenames:
            fsync_path(Path(dirpath) / name)
    for folder in reversed(folders):
        fsync_path(folder)


def _replace_dir(tmp: Path, directory: Path) -> None:
    """Rename the finished ``tmp`` to ``directory``; an older folder of that name is moved aside first
    (to a leftover name that :func:`clean_leftovers` removes) and deleted after."""
    old = directory.with_name(directory.name + ".old.tmp")
    if directory.exists():
        if old.exists():
            shutil.rmtree(old)
        directory.rename(old)
    tmp.rename(directory)
    fsync_path(directory.parent)
    if old.exists():
        shutil.rmtree(old)


class CorruptCheckpointError(UserError):
    """A complete checkpoint whose files were cut short or damaged since it was saved (the message names the
    file)."""


def _defect_by_size(directory: Path, sizes: dict[str, int]) -> str | None:
    for rel, size in sorted(sizes.items()):
        file = directory / rel
        try:
            actual = file.stat().st_size
        except FileNotFoundError:
            return f"{file} is missing"
        if actual != size:
            return (f"{file} is truncated ({actual} of its {size} bytes)" if actual < size else
                    f"{file} is corrupt ({actual} bytes where {size} were written)")
    return None


def _defect_by_header(directory: Path) -> str | None:
    """A checkpoint saved before the state file listed its files' sizes: each safetensors header must cover its
    file (safetensors checks it when opening) and each torch file must end in its zip end record."""
    for file in sorted(directory.rglob("*")):
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), framework="pt", device="cpu"):
                    pass
            except (SafetensorError, OSError) as exc:
                return f"{file} is truncated or corrupt ({exc})"
        elif file.suffix == ".pt" and not zipfile.is_zipfile(file):
            return f"{file} is truncated or corrupt (no zip end record)"
    return None


def checkpoint_defect(directory: str | Path) -> str | None:
    """What makes a complete checkpoint unusable, told cheaply (file sizes, headers; no tensor is read): a file
    missing or not of the size the save wrote (the state file lists them), or, for a checkpoint saved before
    that list, a header that does not cover its file. None: intact."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"{directory / STATE_FILE} is unreadable ({exc})"
    sizes = meta.get("files") if isinstance(meta, dict) else None
    return _defect_by_size(directory, sizes) if isinstance(sizes, dict) else _defect_by_header(directory)


def check_intact(directory: str | Path) -> None:
    """Refuse a checkpoint that :func:`checkpoint_defect` finds corrupt, in one line naming the file."""
    directory = Path(directory)
    if not (directory / STATE_FILE).is_file():
        raise FileNotFoundError(f"{directory}: not a checkpoint (no {STATE_FILE})")
    defect = checkpoint_defect(directory)
    if defect is not None:
        raise CorruptCheckpointError(f"{defect}: the checkpoint {directory} cannot be resumed; resume from an "
                                     "earlier checkpoint (run.resume=latest takes the newest intact one)")


@contextmanager
def _reading(file: Path):
    """A file of the checkpoint that its library cannot parse (damaged with its size unchanged) is an error
    naming it."""
    try:
        yield
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptCheckpointError(f"{file} is corrupt ({why}): resume from an earlier checkpoint") from None


def _load_published_weights(dlm: DiffusionLM, model_dir: Path) -> None:
    """Copy a published-layout checkpoint's tensors into the live (non-LoRA) module, in place."""
    fam = dlm.family
    files = sorted(model_dir.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with _reading(file), safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                state[fam.to_hf_name(name)] = f.get_tensor(name)
    result = dlm.model.load_state_dict(state, strict=False)
    tied = bool(dlm.model.config.tie_word_embeddings)
    # a tensor the published layout stores once (DiffusionGemma's encoder/decoder ties) was filled through its alias
    params = dict(dlm.model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in state if k in params}
    missing = [m for m in result.missing_keys
               if not (tied and m == "lm_head.weight") and not (m in params and id(params[m]) in loaded)]
    if missing or result.unexpected_keys:
        raise UserError(
            f"{model_dir}: checkpoint does not match the model (missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]})"
        )


def load_checkpoint(
    directory: str | Path,
    dlm: DiffusionLM,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    generators: dict[str, torch.Generator] | None = None,
    accelerator: Any = None,
    restore_rng_state: bool = True,
    ema: WeightEMA | None = None,
) -> TrainerState:
    """Restore a checkpoint written by :func:`save_checkpoint` into live objects, in place.

    Full fine-tuning: the weights are read from ``model/``. LoRA (``dlm`` already wrapped with the same
    :class:`~dllm_rl.training.LoraOptions`): the adapters are read from ``adapter/`` and the base weights are
    the ones ``dlm`` was loaded with. Optimizer, scheduler and RNG states are restored when given.
    """
    directory = Path(directory)
    check_intact(directory)
    meta = json.loads((directory / STATE_FILE).read_text())
    rank, world, _ = _rank_world(accelerator)
    if meta.get("lora") and not has_lora(dlm):
        raise UserError(f"{directory}: checkpoint was trained with LoRA; enable LoRA with the same settings")
    if not meta.get("lora") and has_lora(dlm):
        raise UserError(f"{directory}: checkpoint is a full fine-tune but the model has LoRA adapters")
    sharded = is_sharded(accelerator)
    if bool(meta.get("sharded")) != sharded:
        raise UserError(f"{directory}: saved {'with' if meta.get('sharded') else 'without'} a sharded backend "
                        f"(FSDP2 / DeepSpeed), resuming {'with' if sharded else 'without'} one; resume with the "
                        "accelerate config it was trained with")
    if sharded:  # model + optimizer shards; RNG states are restored below from our own files
        accelerator.load_state(str(directory / SHARDED_DIR))
    elif meta.get("lora"):
        load_adapter_weights(dlm, directory / "adapter")
    else:
        _load_published_weights(dlm, directory / "model")
    if optimizer is not None and not sharded:
        file = directory / "optimizer.pt"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: checkpoint has no optimizer state")
        with _reading(file):
            saved = torch.load(file, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(saved)
    if scheduler is not None:
        file = directory / "scheduler.pt"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: checkpoint has no scheduler state")
        with _reading(file):
            saved = torch.load(file, map_location="cpu", weights_only=True)
        scheduler.load_state_dict(saved)
    if ema is not None:
        if (directory / EMA_FILE).is_file():
            ema.load(directory / EMA_FILE)
        else:  # a run that turns the average on when resumed: it starts from the resumed weights
            logger.warning("%s: no %s (saved without a weight average); the average starts here", directory,
                           EMA_FILE)
            ema.reset()
    if restore_rng_state:
        if int(meta.get("world_size", 1)) != world:
            raise UserError(
                f"{directory}: saved with {meta.get('world_size')} processes, resuming with {world}; "
                "exact resume needs the same world size (pass restore_rng_state=False to continue anyway)"
            )
        file = directory / f"rng_state_rank{rank}.pt"
        with _reading(file):
            rng = torch.load(file, map_location="cpu", weights_only=False)
        restore_rng(rng, generators)
    return TrainerState(step=int(meta["step"]), data_state=dict(meta.get("data_state") or {}),
                        extra=dict(meta.get("extra") or {}), path=directory)


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a complete checkpoint folder (name ``step-<digits>``, a readable state file), else None."""
    path = Path(path)
    match = CHECKPOINT_NAME.fullmatch(path.name)
    if match is None or not path.is_dir():
        return None
    try:
        meta = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    step = int(match.group(1))
    return step if isinstance(meta, dict) and meta.get("step") == step else None


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir/checkpoints`` (oldest first); anything else there is ignored."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir() if (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


def _restore_moved_aside(root: Path) -> None:
    """Put back a checkpoint that a save of the same step moved aside (``step-N.old.tmp``, see
    :func:`_replace_dir`) when the save was killed before its own folder took the name: the old folder is the only
    complete copy of step N then. One log line each."""
    for old in sorted(root.glob("step-*.old.tmp")):
        home = old.with_name(old.name.removesuffix(".old.tmp"))
        if home.exists() or not CHECKPOINT_NAME.fullmatch(home.name):
            continue
        try:
            meta = json.loads((old / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("step") == int(home.name.removeprefix("step-")):
            old.rename(home)
            logger.warning("%s: a save of the same step was cut short after moving it aside; put back as %s",
                           old, home.name)


def clean_leftovers(output_dir: str | Path) -> list[Path]:
    """Delete the checkpoint-named entries under ``output_dir/checkpoints`` that are not complete checkpoints
    (``*.tmp`` folders of a save cut short, a folder without its state file); one log line each. A complete
    checkpoint that a re-save of its step moved aside and never replaced is put back first. Other names
    are not the trainer's and stay. Call it from the main rank only, with the run directory locked (another
    run's save in progress looks like a leftover). Returns what went."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    _restore_moved_aside(root)
    doomed = sorted(p for p in root.iterdir() if LEFTOVER_NAME.fullmatch(p.name) and checkpoint_step(p) is None)
    for p in doomed:
        logger.warning("%s: not a complete checkpoint (a save cut short?); removed", p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return doomed


_SAID: set[str] = set()  # the corrupt checkpoints already warned about (a resume looks for the latest twice)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete and intact checkpoint under ``output_dir/checkpoints``, or None. A newer one that
    :func:`checkpoint_defect` finds corrupt is passed over with one warning (once per process)."""
    corrupt, intact = [], None
    for path in reversed(list_checkpoints(output_dir)):
        defect = checkpoint_defect(path)
        if defect is None:
            intact = path
            break
        corrupt.append((path, defect))
    for path, defect in corrupt:
        line = (f"{defect}: the checkpoint {path} is skipped; "
                + (f"the newest intact checkpoint is {intact}" if intact else "no intact checkpoint is left"))
        if line not in _SAID:
            _SAID.add(line)
            logger.warning("%s", line)
    return intact


def prune_checkpoints(output_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints; returns what was deleted (``keep`` None = keep all)."""
    if keep is None or keep <= 0:
        return []
    found = list_checkpoints(output_dir)
    doomed = found[:-keep]
    for p in doomed:
        shutil.rmtree(p)
    return doomed
