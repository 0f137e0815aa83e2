"""The reaper: runs one sandboxed process, enforces the wall-clock timeout, then kills and reaps every
descendant and writes one status line.

The launcher forks :func:`reap_run` per run; the fallback path starts this file once per run::

    python -S -I -B reaper.py <hex of marshal(cfg)>

``cfg``: ``argv``, ``env``, ``cwd``, ``uid`` / ``gid`` (None: stay), ``rlimits`` ([(name, value)]),
``timeout`` (s), ``quiet_fds`` (the reaper's copies of the run's pipes, pointed at /dev/null once the
sandboxed process has them, so that no process outside the sandbox holds the marker pipe) and, when run
by path, ``status_fd``.
"""

import _signal as signal  # the C module: importing ``signal`` would pull in enum (slow start-up)
import ctypes
import marshal
import os
import resource
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def _exec_child(cfg, sfd, reaper_pid):
    """In the forked child: own process group, rlimits, unprivileged user, then exec (never returns)."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        os.setpgid(0, 0)
        for name, value in cfg["rlimits"]:
            resource.setrlimit(getattr(resource, name), (value, value))
        if cfg["uid"] is not None:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # after the uid change, which clears it
        if os.getppid() != reaper_pid:
            os._exit(137)
        os.chdir(cfg["cwd"])
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as exc:
        try:
            os.write(sfd, (f"E cannot start sandboxed process: {exc!r}\n").encode())
        finally:
            os._exit(127)


def _reap(pid, state):
    """Reap every finished child; remember ``pid``'s status. False once no child is left."""
    try:
        while True:
            p, st = os.waitpid(-1, os.WNOHANG)
            if p == 0:
                return True
            if p == pid and state["status"] is None:
                state["status"] = st
    except ChildProcessError:
        return False


def _children(me):
    """Pids whose parent is ``me`` (the re-parented descendants too: we are a child subreaper)."""
    try:
        with open(f"/proc/self/task/{me}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _kill_all(pid, me, state):
    """Kill the process group and every remaining descendant until none is left (at most 3 s)."""
    end = time.monotonic() + 3.0
    while True:
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        for k in _children(me):
            try:
                os.kill(k, 9)
            except OSError:
                pass
        if not _reap(pid, state) or time.monotonic() > end:
            return
        signal.sigtimedwait([signal.SIGCHLD], 0.01)


def _status_text(status):
    if status is None:
        return "killed"
    if os.WIFEXITED(status):
        return f"exit {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"status {status}"


def reap_run(cfg, sfd):
    """Run ``cfg["argv"]`` in a child, enforce the timeout, kill and reap every descendant, then write one
    status line (``S exit 0``, ``S signal 9 timeout``, ...) to ``sfd`` (close-on-exec)."""
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        _exec_child(cfg, sfd, me)
    quiet = cfg.get("quiet_fds") or []
    if quiet:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in quiet:
            os.dup2(null, fd, inheritable=False)
        os.close(null)
    state = {"status": None}
    timed_out = False
    deadline = time.monotonic() + cfg["timeout"]
    while True:
        _reap(pid, state)
        if state["status"] is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        signal.sigtimedwait([signal.SIGCHLD], min(left, 0.5))
    _kill_all(pid, me, state)
    code = _status_text(state["status"])
    os.write(sfd, ("S {}{}\n".format(code, " timeout" if timed_out else "")).encode())


def main():
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    os.set_inheritable(cfg["status_fd"], False)
    reap_run(cfg, cfg["status_fd"])


if __name__ == "__main__":
    main()
