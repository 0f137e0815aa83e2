"""Launching several real ranks from a test: a free loopback port for the rendezvous, and one wait that kills
every process of the launch and fails the test when the ranks hang (a collective only some ranks reached).

The launcher (``accelerate launch`` / torchrun) starts each rank in a session of its own, so killing the
launcher's process group would leave the ranks running; the ranks are found as the launcher's descendants
(psutil, which accelerate already depends on) and killed with it. Output goes to a file, not a pipe: a rank
that outlives the launcher cannot hold the test's read open, and a full pipe buffer can never block a rank.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile

import psutil
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def run_ranks(cmd: list[str], env: dict[str, str], cwd, timeout: float, hung: str) -> tuple[int, str]:
    """Run ``cmd`` (a launcher of the ranks); ``(exit status, output)``. After ``timeout`` seconds every process
    of the launch is killed and the test fails with ``hung`` and the output's end. Whatever happens (a timeout,
    an interrupt), no rank outlives this call."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_tree(proc.pid)  # the launcher, and ranks it left behind
        out.seek(0)
        log = out.read()
    if timed_out:
        pytest.fail(f"{hung}\n" + log[-4000:])
    return proc.returncode, log
