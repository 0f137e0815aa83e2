"""Launching several real ranks from a test: a free loopback port for the rendezvous, and one wait that kills
the whole process group and fails the test when the ranks hang (a collective only some ranks reached)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(cmd: list[str], env: dict[str, str], cwd, timeout: float, hung: str) -> tuple[int, str]:
    """Run ``cmd`` (a launcher of the ranks) in its own session; ``(exit status, output)``. After ``timeout``
    seconds the process group is killed and the test fails with ``hung`` and the output's end."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"{hung}\n" + log[-4000:])
    return proc.returncode, log
