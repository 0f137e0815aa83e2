"""stdin/stdout tests: each case runs the program in a forked child that never holds the marker pipe (the
harness is non-dumpable, so the child cannot reopen the pipe through ``/proc``); the host compares the
outputs itself.
"""

import builtins
import os
import select
import sys

from .wire import describe


def _run_case(code, marker_fd, inp, out):
    """In the forked child: stdin/stdout on the case's memfds, run the program as ``__main__``, exit."""
    try:
        os.close(marker_fd)
        os.dup2(inp, 0)
        os.dup2(out, 1)
        os.close(inp)
        os.close(out)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        rc = 0
        try:
            exec(code, {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as exc:
            c = exc.code
            rc = c if isinstance(c, int) else (0 if c is None else 1)
            if not isinstance(c, int) and c is not None:
                sys.stderr.write(str(c) + "\n")
        except BaseException:
            import traceback

            traceback.print_exc()
            rc = 1
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        os._exit(rc & 255)
    except BaseException:
        os._exit(120)


def _wait(pid, per_test):
    """Wait for the case's child (killing it after ``per_test`` seconds); its verdict text."""
    timed_out = False
    if per_test and hasattr(os, "pidfd_open"):
        pfd = os.pidfd_open(pid)
        ready = select.select([pfd], [], [], per_test)[0]
        os.close(pfd)
        if not ready:
            timed_out = True
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return b"timeout"
    if os.WIFEXITED(status):
        return b"exit %d" % os.WEXITSTATUS(status)
    return b"signal %d" % os.WTERMSIG(status)


def run_stdio_tests(job, marker_fd, emit):
    """Run the program once per case (``job["tests"]`` are the stdin texts); ``emit(i, b"out", verdict,
    output)`` with the exit verdict and at most ``job["output_cap"]`` bytes of stdout."""
    cap = int(job["output_cap"])
    per_test = job.get("test_timeout")
    tests = job["tests"]
    try:
        code = compile(job["program"], "<solution>", "exec")
    except BaseException as exc:
        why = describe(exc).encode("utf-8", "replace")
        for i in range(len(tests)):
            emit(i, b"out", b"compile error: " + why)
        return
    for i, test in enumerate(tests):
        inp = os.memfd_create("stdin")
        out = os.memfd_create("stdout")
        data = test.encode("utf-8")
        while data:
            data = data[os.write(inp, data) :]
        os.lseek(inp, 0, 0)
        pid = os.fork()
        if pid == 0:
            _run_case(code, marker_fd, inp, out)
        os.close(inp)
        verdict = _wait(pid, per_test)
        size = os.lseek(out, 0, 2)
        os.lseek(out, 0, 0)
        output = os.read(out, min(size, cap)) if size else b""
        os.close(out)
        emit(i, b"out", verdict, output)
