"""tests/two_ranks.py, the launcher every multi-rank test uses: a hang fails the test and leaves nothing
running, even a "rank" in a session of its own (as torchrun starts them) that holds the output open."""

from __future__ import annotations

import sys

import psutil
import pytest
from two_ranks import run_ranks

# A launcher that starts one child in a new session (like torch elastic's workers), prints both pids, and
# waits on it forever; the child sleeps with the launcher's stdout open.
LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("launcher", {pid}, "child", child.pid, flush=True)
child.wait()
"""


def test_a_hang_fails_and_kills_ranks_in_their_own_session(tmp_path):
    cmd = [sys.executable, "-c", LAUNCHER.replace("{pid}", "__import__('os').getpid()")]
    with pytest.raises(pytest.fail.Exception, match="ranks hung") as failed:
        run_ranks(cmd, {}, tmp_path, timeout=3, hung="ranks hung")
    words = str(failed.value).split()
    launcher, child = int(words[words.index("launcher") + 1]), int(words[words.index("child") + 1])
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_output_and_exit_status_come_back(tmp_path):
    rc, log = run_ranks([sys.executable, "-c", "print('rank 0 done'); raise SystemExit(3)"], {}, tmp_path,
                        timeout=30, hung="unused")
    assert (rc, log) == (3, "rank 0 done\n")
