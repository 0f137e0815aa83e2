"""The test harness: the sandboxed process that runs a job's tests and reports each verdict.

    python -S -I -B harness.py <marker fd> <function|stdio> <nproc or 0> job-<tag>

The job (marshal: ``nonce``, ``program``, ``setup``, ``tests``, ``output_cap``, ``test_timeout``) comes
on stdin. A test counts only when this process writes ``<nonce> <i> ok ...`` to the marker pipe after
the test completed. The program never runs in this process: for function tests it runs in a child
forked *before* the job (and so the nonce) is read, with the marker pipe and stdin closed, and answers
calls over its own pipes with plain data (:mod:`candidate`, :mod:`calls`); for stdin/stdout tests each
case runs in a forked child without the marker pipe (:mod:`stdio`). This process makes itself
non-dumpable first, so that no child can read its memory or reopen its descriptors through ``/proc``.
"""

import ctypes
import marshal
import os
import resource
import sys

if __name__ == "__main__" and not __package__:  # run by path: import the siblings as package _child
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "_child"

from . import calls, candidate, stdio  # noqa: E402

PR_SET_DUMPABLE = 4


def reporter(fd, nonce):
    """The function that writes test ``i``'s marker: ``<nonce> <i> <status> <len detail> <len output>``."""

    def emit(i, status, detail=b"", output=b""):
        data = b"%s %d %s %d %d\n" % (nonce, i, status, len(detail), len(output)) + detail + output
        while data:
            data = data[os.write(fd, data) :]

    return emit


def _wait_for_exit(rep_r, seconds):
    """Give the program's process up to ``seconds`` to flush its output and exit (end of its reply pipe)."""
    import select
    import time

    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            if select.select([rep_r], [], [], max(0.0, end - time.monotonic()))[0] and not os.read(rep_r, 1 << 16):
                return
    except OSError:
        pass


def main(argv):
    fd, mode, nproc = int(argv[1]), argv[2], int(argv[3])
    if nproc:
        # Inside bubblewrap's user namespace this limit counts this sandbox's processes only, so a fork
        # bomb in one run cannot starve runs in parallel sandboxes of the same user.
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.stderr.write("sandbox harness: prctl(PR_SET_DUMPABLE, 0) failed; refusing to run tests\n")
        return
    link = calls.Link(*candidate.start([fd])) if mode == "function" else None
    job = marshal.loads(sys.stdin.buffer.read())
    emit = reporter(fd, job.pop("nonce").encode())
    if link is None:
        stdio.run_stdio_tests(job, fd, emit)
        return
    calls.run_function_tests(job, link, emit)
    os.close(link.req_w)
    _wait_for_exit(link.rep_r, 1.0)


if __name__ == "__main__":
    try:
        main(sys.argv)
    finally:
        try:
            sys.stdout.flush()
        except BaseException:
            pass
        os._exit(0)
