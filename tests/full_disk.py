"""A full disk under one folder, as the writers a save goes through report it (seen on a full tmpfs): safetensors
raises a ``SafetensorError`` ending ``No space left on device (os error 28)``; ``torch.save`` to a file object
raises ``RuntimeError: ... unexpected pos`` with the file's ``OSError(ENOSPC)`` as its context; ``torch.save`` to
a path raises that ``RuntimeError`` with no error number at all, the disk left with no free space. Each writes part
of its file first, as a real full disk lets it."""

from __future__ import annotations

import errno
import fnmatch
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError

import dllm_rl.models.loading as loading

NO_SPACE = "No space left on device"
PARTIAL = 64  # bytes a writer gets onto the disk before it is full


def _under(target: Path, folder: Path) -> bool:
    """In ``folder`` or in its temporary twin ``folder.tmp`` (where a checkpoint is written before its rename)."""
    return any(p in (folder, folder.with_name(folder.name + ".tmp")) for p in target.parents)


class _FillingFile:
    """A file object whose writes fail with ENOSPC once ``PARTIAL`` bytes are in."""

    def __init__(self, f):
        self.f, self.written = f, 0

    def write(self, data) -> int:
        data = bytes(data)
        room = PARTIAL - self.written
        if len(data) > room:
            self.f.write(data[:max(room, 0)])
            self.written = PARTIAL
            raise OSError(errno.ENOSPC, NO_SPACE)
        self.written += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def disk_full_at(monkeypatch, folder: Path, names: tuple[str, ...] = ("*",)) -> None:
    """Until ``monkeypatch.undo()``, writing a file whose name matches one of ``names`` into ``folder`` (or its
    ``.tmp`` twin, at any depth) fails as on a full disk; other files and folders are written."""
    real_save_file, real_torch_save, real_usage = loading.save_file, torch.save, shutil.disk_usage
    partial: list[Path] = []

    def hit(target) -> bool:
        target = Path(target)
        return _under(target, folder) and any(fnmatch.fnmatch(target.name, n) for n in names)

    def save_file(tensors, filename, metadata=None):
        if not hit(filename):
            return real_save_file(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(b"\0" * PARTIAL)
        partial.append(Path(filename))
        raise SafetensorError(f"Error while serializing: I/O error: {NO_SPACE} (os error {errno.ENOSPC})")

    def save(obj, f, *args, **kwargs):
        name = f if isinstance(f, (str, Path)) else getattr(f, "name", None)
        if not isinstance(name, (str, Path)) or not hit(name):
            return real_torch_save(obj, f, *args, **kwargs)
        partial.append(Path(name))
        if not isinstance(f, (str, Path)):  # a file object: torch's own error, the ENOSPC as its context
            return real_torch_save(obj, _FillingFile(f), *args, **kwargs)
        Path(f).write_bytes(b"\0" * PARTIAL)
        error = RuntimeError(f"[enforce fail at inline_container.cc:672] . unexpected pos {PARTIAL + 112} vs {PARTIAL}")
        error.__context__ = RuntimeError("basic_ios::clear: iostream error")  # raised while torch handled this one
        raise error

    def disk_usage(path):  # no free space while a partial file fills the disk
        usage = real_usage(path)
        return usage._replace(free=0) if any(p.exists() for p in partial) else usage

    monkeypatch.setattr(loading, "save_file", save_file)
    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
