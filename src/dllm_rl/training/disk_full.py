"""A disk that fills up while a run writes a checkpoint or its model, told apart from other failures.

The writers a save goes through report a full disk in three ways, as seen on a full tmpfs:

- Python's own writes (json, yaml, a file object) raise ``OSError(ENOSPC)``;
- safetensors (Rust) raises a ``SafetensorError`` whose message ends ``No space left on device (os error 28)``;
- ``torch.save`` to a path writes through C++ streams that drop the error number: ``RuntimeError: ...
  unexpected pos N vs M``. :func:`torch_save` writes through a Python file instead, so the ``OSError`` stays
  in the exception's chain; for the writers of other libraries (accelerate's ``save_state``) a
  ``RuntimeError`` raised while the disk has (almost) no free space left is taken as a full disk too.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dllm_rl.errors import UserError

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
NEARLY_FULL = 1 << 20  # bytes: less free than this after a failed write is a full disk


class DiskFullError(UserError):
    """The disk filled up while a checkpoint or a model was written (the message names the folder, the size
    needed and the free space)."""


def _chain(exc: BaseException):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def free_bytes(where: str | Path) -> int | None:
    """Free bytes on the file system of ``where`` (its nearest existing folder); None when it cannot be told."""
    where = Path(where)
    try:
        existing = next(p for p in (where, *where.parents) if p.exists())
        return shutil.disk_usage(existing).free
    except (OSError, StopIteration):
        return None


def is_disk_full(exc: BaseException, where: str | Path) -> bool:
    """Whether ``exc``, raised while writing under ``where``, comes from a full disk (see the module docstring);
    call it before removing what was written (the partial files are what fill the disk)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if NO_SPACE in str(e) or f"(os error {errno.ENOSPC})" in str(e):  # safetensors' Rust I/O error
            return True
    if isinstance(exc, RuntimeError):  # torch's C++ writer: no error number to read
        free = free_bytes(where)
        return free is not None and free < NEARLY_FULL
    return False


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def disk_full_error(what: str, path: Path, need: int, advice: str) -> DiskFullError:
    """``no space left on device writing {what} {path}: it needs about N, M free there; {advice}`` (the free
    space left out when it cannot be told)."""
    free = free_bytes(path)
    there = f", {human_size(free)} free there" if free is not None else ""
    return DiskFullError(f"no space left on device writing {what} {path}: it needs about {human_size(need)}{there}; "
                         f"{advice}")


def torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through a Python file, so that a full disk raises with ``ENOSPC`` in its chain (torch's own
    path writer loses it; see the module docstring)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
