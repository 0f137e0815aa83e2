"""The launcher: a long-lived process that forks one reaper per run (saves an interpreter start per run).

    python -S -I -B launcher.py <socket fd>

It receives each run's config (marshal) and its five pipe ends (stdin, stdout, stderr, markers, status)
over a unix socket, forks a reaper that puts them on fds 0-4 and runs :func:`reaper.reap_run`, and
answers with the reaper's pid. EOF on the socket (the host is gone) ends it.
"""

import fcntl
import marshal
import os
import socket
import sys

if __name__ == "__main__" and not __package__:  # run by path: import the siblings as package _child
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "_child"

from .reaper import reap_run, signal  # noqa: E402


def _start_reaper(msg, fds, sock):
    """In the forked reaper: pipes on fds 0-4 (0-3 inheritable), everything else closed, then reap."""
    try:
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target, inheritable=target < 4)
        os.closerange(5, 1 << 16)
        reap_run(marshal.loads(msg), 4)
    finally:
        os._exit(0)


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # finished reapers are reaped by the kernel
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except InterruptedError:
            continue
        except OSError:
            break
        if not msg:
            break
        pid = os.fork()
        if pid == 0:
            _start_reaper(msg, fds, sock)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(b"%d" % pid)
        except OSError:
            break


if __name__ == "__main__":
    main()
