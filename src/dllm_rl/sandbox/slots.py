"""One unprivileged uid per concurrent run, so that one program's process limit never touches another's.

RLIMIT_NPROC counts every process of a uid: were all runs one user's, a fork bomb that fills its limit would
leave a correct program run beside it unable to start its own process (it scored 0, or the reaper could not
fork and :class:`SandboxError` escaped the reward). Bubblewrap's user namespace already keeps a count per
sandbox; without it (or where user namespaces are disabled) only distinct uids do. Slot 0 is the sandbox
user itself (``dllm-sandbox``), slot ``k`` the system user ``dllm-sandbox-k`` (created with ``useradd
--system`` in the sandbox user's group on first use; the same access to the interpreter and the child
programs). A run holds its slot through an exclusive ``flock`` on ``<lock dir>/<k>`` until every process of
the run is gone, so slots are exclusive across threads and host processes alike. Where a slot user cannot be
created the run shares the sandbox user (and a warning says that parallel runs share one process limit).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .isolation import Isolation, ensure_user, warn_once
from .limits import SandboxError

MAX_SLOTS = 512
_UIDS: dict[tuple[int, int], int | None] = {}
_LOCK = threading.Lock()


def lock_dir() -> str:
    """Root-owned directory of the slot lock files (no sandboxed user can take or hold a slot's lock)."""
    for path in ("/run/dllm-sandbox-slots", os.path.join(tempfile.gettempdir(), f"dllm-sandbox-slots-{os.geteuid()}")):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        st = os.lstat(path)
        if st.st_uid == os.geteuid() and (st.st_mode & 0o7777) == 0o700 and os.path.isdir(path):
            return path
    raise SandboxError("no private directory for the sandbox's uid slots (/run/dllm-sandbox-slots or under $TMPDIR)")


def _slot_uid(iso: Isolation, k: int) -> int | None:
    """The uid of slot ``k`` (creating its user once); None where it cannot be had."""
    if k == 0:
        return iso.uid
    key = (iso.uid or 0, k)
    with _LOCK:
        if key not in _UIDS:
            name = f"{pwd.getpwuid(iso.uid).pw_name}-{k}" if iso.uid is not None else None
            entry = ensure_user(name, iso.gid) if name else None
            _UIDS[key] = entry.pw_uid if entry is not None and entry.pw_uid not in (0, iso.uid) else None
        return _UIDS[key]


@contextmanager
def run_uid(iso: Isolation) -> Iterator[int | None]:
    """The uid a run executes as, exclusive to it while the ``with`` block runs (None: the current user)."""
    if iso.uid is None:
        yield None
        return
    where = lock_dir()
    for k in range(MAX_SLOTS):
        fd = os.open(os.path.join(where, str(k)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            uid = _slot_uid(iso, k)
            if uid is not None:
                yield uid
                return
        finally:
            os.close(fd)  # releases the lock
        break
    warn_once(
        "slots",
        f"sandbox: no free per-run user (slot users {iso.user}-N could not be created or all {MAX_SLOTS} are "
        f"busy); parallel runs share {iso.user}'s process limit",
    )
    yield iso.uid
