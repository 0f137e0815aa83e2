"""Starting reapers: through a long-lived launcher process (one per isolation set-up and host process,
which forks a reaper per run), or one ``subprocess`` reaper per run where the launcher is unavailable;
and the kill functions the runner calls when a run must end."""

from __future__ import annotations

import atexit
import marshal
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable

from .isolation import CHILD_DIR, Isolation, base_env, warn_once
from .limits import SandboxError

# The launcher and the reaper run as the host's user outside bubblewrap, so they read this package's own
# _child folder (the sandboxed harness reads Isolation.child_dir).
LAUNCHER = os.path.join(CHILD_DIR, "launcher.py")
REAPER = os.path.join(CHILD_DIR, "reaper.py")


def popen_killer(proc: subprocess.Popen) -> Callable[..., None]:
    """Kill function for a Popen'd reaper: kill its process group (unless ``final``), then wait for it."""

    def kill(final: bool = False) -> None:
        if not final:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    return kill


def pid_killer(pid: int) -> Callable[..., None]:
    """Kill function for a launcher-forked reaper (own session; the launcher's kernel auto-reap frees it)."""

    def kill(final: bool = False) -> None:
        if not final:
            for fn in (os.killpg, os.kill):
                try:
                    fn(pid, signal.SIGKILL)
                except OSError:
                    pass

    return kill


def popen_reaper(iso: Isolation, cfg: dict, child_ends: list[int]) -> Callable[..., None]:
    """Start one reaper for ``cfg`` with ``subprocess`` (stdin, stdout, stderr, markers, status pipe ends);
    returns its kill function."""
    marker_w, status_w = child_ends[3], child_ends[4]
    cfg = {**cfg, "status_fd": status_w, "quiet_fds": [0, 1, 2, marker_w]}
    try:
        proc = subprocess.Popen(
            [iso.python, "-S", "-I", "-B", REAPER, marshal.dumps(cfg, 4).hex()],
            stdin=child_ends[0],
            stdout=child_ends[1],
            stderr=child_ends[2],
            pass_fds=(marker_w, status_w),
            start_new_session=True,
            cwd="/",
            env=base_env("/tmp"),
        )
    except OSError as exc:
        raise SandboxError(f"cannot start the sandbox reaper with {iso.python}: {exc}") from exc
    return popen_killer(proc)


class Launcher:
    """Host side of the launcher process (one per isolation set-up and host process)."""

    def __init__(self, iso: Isolation) -> None:
        self.pid_owner = os.getpid()
        self.lock = threading.Lock()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [iso.python, "-S", "-I", "-B", LAUNCHER, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                cwd="/",
                env=base_env("/tmp"),
            )
        finally:
            theirs.close()
        self.broken = False

    def launch(self, cfg: dict, fds: list[int]) -> Callable[..., None] | None:
        """Ask the launcher to start a reaper for ``cfg`` with these pipe ends (they land on fds 0-4 of the
        reaper, the marker pipe on 3); returns a kill function, or None when the launcher is not working
        (the caller then starts a reaper itself)."""
        with self.lock:
            if self.broken:
                return None
            try:
                socket.send_fds(self.sock, [marshal.dumps({**cfg, "quiet_fds": [0, 1, 2, 3]}, 4)], fds)
                pid = int(self.sock.recv(64))
            except (OSError, ValueError):
                self.broken = True
                warn_once("launcher", "sandbox: the launcher process stopped; starting one reaper per run")
                return None
        return pid_killer(pid)

    def close(self) -> None:
        """Close the socket (the launcher exits on EOF) and wait for it."""
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_LAUNCHERS: dict[Isolation, Launcher] = {}
_LAUNCH_LOCK = threading.Lock()


def launcher_for(iso: Isolation) -> Launcher | None:
    """The running launcher for ``iso`` (started on first use; None where fd passing is unavailable)."""
    if not hasattr(socket, "send_fds") or tuple(map(int, iso.python_version.split("."))) < (3, 9):
        return None
    with _LAUNCH_LOCK:
        la = _LAUNCHERS.get(iso)
        if la is not None and (la.pid_owner != os.getpid() or la.broken or la.proc.poll() is not None):
            la = None  # a forked host process, or a dead launcher: start a fresh one
        if la is None:
            try:
                la = Launcher(iso)
            except OSError:
                return None
            _LAUNCHERS[iso] = la
        return la


@atexit.register
def _close_launchers() -> None:
    for la in list(_LAUNCHERS.values()):
        if la.pid_owner == os.getpid():
            la.close()
    _LAUNCHERS.clear()
