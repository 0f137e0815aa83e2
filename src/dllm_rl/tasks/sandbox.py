"""Run untrusted code (model completions) and count the tests it passes.

Isolation, outermost first:

1. **Reaper.** Every run gets an intermediate Python process (the *reaper*) in its own session. It makes
   itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)`` through ``ctypes``), forks the sandboxed
   process, enforces the wall-clock timeout and, when the run ends for any reason, kills the process
   group and every descendant that was re-parented to it, then reaps them: no process or zombie outlives
   a run. To keep start-up cheap, reapers are forked from a small long-lived *launcher* process (one per
   host process, receiving each run's pipes over a unix socket); where that is unavailable each run
   starts its own reaper with ``subprocess`` (``use_launcher=False``).
2. **Unprivileged user.** When the host runs as root, the sandboxed process drops to a dedicated system
   user (``dllm-sandbox``, created with ``useradd --system`` if missing; ``nobody`` if that fails). Not
   root: it runs as the current user, and a warning says so once.
3. **rlimits** set before the program starts: CPU seconds, address space, processes, file size, open
   files, no core dumps.
4. **bubblewrap** (``bwrap``) when installed and usable: new network namespace (only ``lo``), new PID /
   IPC / UTS / user namespaces, a read-only view of ``/usr`` (and the interpreter's prefix) only, a
   read-only ``/`` and ``/dev``, private size-limited tmpfs mounts at ``/tmp`` (the working directory)
   and ``/dev/shm``, ``--die-with-parent``. Without bwrap (or where user namespaces are disabled) the
   sandbox degrades to 1-3 in a private temp dir and logs a warning once; the code can then reach the
   network and write where the sandbox user may (world-writable ``/tmp``, ``/dev/shm``).
5. **Interpreter.** A Python the sandbox user can execute (the base interpreter of the venv, or
   ``/usr/bin/python3``; checked by running it as that user) started with ``-S -I -B``: no site
   import, isolated mode, so start-up is cheap and no host packages leak in.

Passing is proven, not inferred from the exit code. The harness reads a per-run random nonce and the
number of a pipe from the host; after each test completes it writes ``<nonce> <i> ok`` to that pipe.
Only those markers count, so ``sys.exit(0)`` / ``os._exit(0)`` before the asserts, a killed parent or
a crash pass nothing. Between tests the harness restores ``builtins`` and the namespace of every module
loaded so far (snapshotted as soon as each import completes, through an ``__import__`` hook), so a
program cannot monkey-patch the helpers the asserts use (``abs``, ``math.isclose``, ...).
stdin/stdout tests run each case in a forked child that never sees the marker pipe (the harness is
non-dumpable, so the child cannot reopen it through ``/proc``) and the host compares the outputs itself.

Known limit: function tests run in the same interpreter as the program (they must call its functions),
so a program that inspects interpreter frames or memory could in principle read the nonce; and an
object whose ``__eq__`` always returns True defeats ``assert f(x) == y``. Both need deliberate
adversarial code; none of the usual exit / patching tricks work.
"""

from __future__ import annotations

import atexit
import logging
import marshal
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SANDBOX_USER = "dllm-sandbox"

# --------------------------------------------------------------------------------------------------
# Code that runs in the child processes. Kept compatible with Python 3.8 (the sandbox interpreter may be
# older than the host's) and free of f-strings that need 3.12.
# --------------------------------------------------------------------------------------------------

_REAPER_CORE = r"""
import os, sys, marshal, _signal as signal, time, resource, ctypes
libc = ctypes.CDLL(None, use_errno=True)


def reap_run(cfg, sfd):
    # Run cfg["argv"] in a child (rlimits, unprivileged user), enforce the timeout, then kill and reap
    # every descendant (we are a child subreaper) and write one status line to sfd (close-on-exec).
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            os.setpgid(0, 0)
            for name, value in cfg["rlimits"]:
                resource.setrlimit(getattr(resource, name), (value, value))
            if cfg["uid"] is not None:
                os.setgroups([])
                os.setgid(cfg["gid"])
                os.setuid(cfg["uid"])
            libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL (after the uid change, which clears it)
            if os.getppid() != me:
                os._exit(137)
            os.chdir(cfg["cwd"])
            os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
        except BaseException as exc:
            try:
                os.write(sfd, ("E cannot start sandboxed process: %r\n" % (exc,)).encode())
            finally:
                os._exit(127)
    state = {"status": None}

    def reap():
        try:
            while True:
                p, st = os.waitpid(-1, os.WNOHANG)
                if p == 0:
                    return True
                if p == pid and state["status"] is None:
                    state["status"] = st
        except ChildProcessError:
            return False

    timed_out = False
    deadline = time.monotonic() + cfg["timeout"]
    while True:
        reap()
        if state["status"] is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        signal.sigtimedwait([signal.SIGCHLD], min(left, 0.5))

    def children():
        try:
            with open("/proc/self/task/%d/children" % me) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            out = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open("/proc/%s/stat" % name) as f:
                            if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                                out.append(int(name))
                    except (OSError, ValueError, IndexError):
                        pass
            return out

    end = time.monotonic() + 3.0
    while True:
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
        for k in children():
            try:
                os.kill(k, 9)
            except OSError:
                pass
        if not reap() or time.monotonic() > end:
            break
        signal.sigtimedwait([signal.SIGCHLD], 0.01)
    status = state["status"]
    if status is None:
        code = "killed"
    elif os.WIFEXITED(status):
        code = "exit %d" % os.WEXITSTATUS(status)
    elif os.WIFSIGNALED(status):
        code = "signal %d" % os.WTERMSIG(status)
    else:
        code = "status %d" % status
    os.write(sfd, ("S %s%s\n" % (code, " timeout" if timed_out else "")).encode())
"""

# One reaper per run, started with Popen (the fallback path).
_REAPER = (
    _REAPER_CORE
    + r"""
cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
os.set_inheritable(cfg["status_fd"], False)
reap_run(cfg, cfg["status_fd"])
"""
)

# A long-lived launcher that forks one reaper per run (saves a Python start-up per run). It receives
# the run's config plus its five pipe ends (stdin, stdout, stderr, markers, status) over a unix socket,
# forks, and answers with the reaper's pid. EOF on the socket (the host is gone) ends it.
_LAUNCHER = (
    _REAPER_CORE
    + r"""
import socket, fcntl
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
    for fd in fds:
        os.close(fd)
    try:
        sock.send(b"%d" % pid)
    except OSError:
        break
"""
)

_HARNESS = r"""
import os, sys, marshal, builtins
def _main():
    fd = int(sys.argv[1])
    job = marshal.loads(sys.stdin.buffer.read())
    nonce = job.pop("nonce").encode()
    if job.get("nproc"):
        # Inside bubblewrap's user namespace this limit counts this sandbox's processes only, so a fork
        # bomb in one run cannot starve runs in parallel sandboxes of the same user.
        import resource
        resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
    _write = os.write
    _len = len
    def emit(i, status, detail=b"", output=b""):
        data = b"%s %d %s %d %d\n" % (nonce, i, status, _len(detail), _len(output)) + detail + output
        while data:
            data = data[_write(fd, data):]
    def describe(exc):
        try:
            name = type(exc).__name__
            text = str(exc)
        except BaseException:
            return b"exception"
        if _len(text) > 300:
            text = text[:300] + "..."
        return ("%s: %s" % (name, text) if text else name).encode("utf-8", "replace")
    program = job["program"]
    tests = job["tests"]
    if job["mode"] == "function":
        # Snapshot every module's namespace as soon as it is loaded (modules already loaded now, and
        # any later import through an __import__ hook), and restore them all before each test, so
        # that patching helpers the asserts use (builtins.abs, math.isclose, ...) has no effect.
        sysmods = sys.modules
        snaps = {}
        def snap_new():
            for name, m in list(sysmods.items()):
                if name not in snaps and m is not None:
                    try:
                        if getattr(getattr(m, "__spec__", None), "_initializing", False):
                            continue  # still executing its body; snapshot it once complete
                        snaps[name] = (m, dict(m.__dict__))
                    except BaseException:
                        pass
        snap_new()
        orig_import = builtins.__import__
        def hooked_import(name, globals=None, locals=None, fromlist=(), level=0):
            m = orig_import(name, globals, locals, fromlist, level)
            snap_new()
            return m
        builtins.__import__ = hooked_import
        snaps["builtins"] = (builtins, dict(builtins.__dict__))
        def restore():
            for name, (m, snap) in list(snaps.items()):
                d = m.__dict__
                if m is builtins:
                    for k in [k for k in d if k not in snap]:
                        del d[k]
                for k, v in snap.items():
                    if d.get(k, restore) is not v:
                        d[k] = v
                if sysmods.get(name) is not m:
                    sysmods[name] = m
        ns = {"__name__": "solution", "__builtins__": builtins}
        step = "program"
        try:
            exec(compile(program, "<solution>", "exec"), ns)
            restore()
            step = "setup"
            if job.get("setup"):
                exec(compile(job["setup"], "<setup>", "exec"), ns)
        except BaseException as exc:
            why = describe(exc)
            for i in range(_len(tests)):
                emit(i, b"fail", b"" + step.encode() + b" failed: " + why)
            return
        for i, test in enumerate(tests):
            restore()
            try:
                exec(compile(test, "<test %d>" % i, "exec"), ns)
            except BaseException as exc:
                emit(i, b"fail", describe(exc))
                continue
            emit(i, b"ok")
        return
    # stdio: each case in a forked child that has no access to the marker pipe
    import ctypes
    import select
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children cannot open /proc/<ppid>/fd
    cap = int(job["output_cap"])
    per_test = job.get("test_timeout")
    try:
        code = compile(program, "<solution>", "exec")
    except BaseException as exc:
        why = describe(exc)
        for i in range(_len(tests)):
            emit(i, b"out", b"compile error: " + why)
        return
    for i, test in enumerate(tests):
        inp = os.memfd_create("stdin")
        out = os.memfd_create("stdout")
        data = test.encode("utf-8")
        while data:
            data = data[os.write(inp, data):]
        os.lseek(inp, 0, 0)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(fd)
                os.dup2(inp, 0)
                os.dup2(out, 1)
                os.close(inp)
                os.close(out)
                sys.stdin = open(0, "r", closefd=False)
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
        os.close(inp)
        status = None
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
            detail = b"timeout"
        elif os.WIFEXITED(status):
            detail = b"exit %d" % os.WEXITSTATUS(status)
        else:
            detail = b"signal %d" % os.WTERMSIG(status)
        size = os.lseek(out, 0, 2)
        os.lseek(out, 0, 0)
        output = os.read(out, min(size, cap)) if size else b""
        os.close(out)
        emit(i, b"out", detail, output)
try:
    _main()
finally:
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os._exit(0)
"""


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the program under test): a set-up problem to fix."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run (all tests of one program).

    ``timeout_s`` is wall-clock time for the whole run; ``cpu_s`` defaults to ``ceil(timeout_s) + 1``.
    ``memory_mb`` caps the address space (RLIMIT_AS), ``nproc`` the processes of the sandbox user,
    ``fsize_mb`` any single file written, ``nofile`` open descriptors, ``output_bytes`` how much of
    stdout / stderr / each test's output is kept (the rest is read and discarded), ``tmpfs_mb`` the size
    of the private ``/tmp`` under bubblewrap. ``test_timeout_s`` bounds each stdin/stdout case.
    """

    timeout_s: float = 10.0
    cpu_s: int | None = None
    memory_mb: int = 1024
    nproc: int = 64
    fsize_mb: int = 16
    nofile: int = 64
    output_bytes: int = 1 << 16
    tmpfs_mb: int = 64
    test_timeout_s: float | None = None

    def rlimits(self) -> list[tuple[str, int]]:
        """The rlimits (name, value) applied to the sandboxed process before it starts."""
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1
        return [
            ("RLIMIT_CPU", int(cpu)),
            ("RLIMIT_AS", int(self.memory_mb) << 20),
            ("RLIMIT_NPROC", int(self.nproc)),
            ("RLIMIT_FSIZE", int(self.fsize_mb) << 20),
            ("RLIMIT_NOFILE", int(self.nofile)),
            ("RLIMIT_CORE", 0),
        ]


@dataclass
class ExecResult:
    """What one sandboxed run produced.

    ``passed[i]`` is True only when the harness reported test ``i`` complete (function tests) or the
    case's output matched and its process exited 0 (stdin/stdout tests). ``details[i]`` says why not.
    ``status`` is the reaper's view of the sandboxed process (``exit N``, ``signal N``), informative only.
    """

    passed: list[bool]
    details: list[str]
    outputs: list[str | None]
    status: str
    timed_out: bool
    stdout: str
    stderr: str
    truncated: bool
    duration_s: float

    @property
    def n_passed(self) -> int:
        """Number of tests that passed."""
        return sum(self.passed)

    @property
    def fraction(self) -> float:
        """Reward of a code completion: passed tests / all tests (0.0 when there are no tests)."""
        return self.n_passed / len(self.passed) if self.passed else 0.0

    def reason(self) -> str:
        """A short human-readable summary for logs."""
        n = len(self.passed)
        if n and self.n_passed == n:
            return f"passed {n}/{n} tests"
        first = next((d for ok, d in zip(self.passed, self.details) if not ok), "")
        extra = " (timeout)" if self.timed_out else ""
        return f"passed {self.n_passed}/{n} tests{extra}; first failure: {first}"[:400]


@dataclass(frozen=True)
class Isolation:
    """How sandboxed code runs on this host (resolved once per process and configuration)."""

    python: str
    python_version: str
    uid: int | None
    gid: int | None
    user: str
    bwrap: str | None
    bwrap_binds: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        """One line for logs: interpreter, user, bubblewrap or not."""
        who = f"user {self.user}" + (" (current user)" if self.uid is None else f" (uid {self.uid})")
        box = f"bubblewrap ({self.bwrap})" if self.bwrap else "no bubblewrap (rlimits + user only)"
        return f"python {self.python} ({self.python_version}), {who}, {box}"


_WARNED: set[str] = set()
_ISOLATION: dict[tuple, Isolation] = {}
_ISO_LOCK = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message)


def _ensure_user(name: str) -> pwd.struct_passwd | None:
    """Return the passwd entry of ``name``, creating it as a system user when root and missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    if os.path.exists(useradd):
        cmd = [
            useradd,
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ]
        subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _candidate_pythons(explicit: str | None) -> list[str]:
    cands = [explicit] if explicit else []
    cands += [
        getattr(sys, "_base_executable", None),
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        shutil.which("python3"),
    ]
    out: list[str] = []
    for c in cands:
        if c and os.path.isfile(c):
            real = os.path.realpath(c)
            if real not in out:
                out.append(real)
    return out


def _probe(argv: list[str], uid: int | None, gid: int | None, timeout: float = 20.0) -> str | None:
    kwargs: dict = {}
    if uid is not None:
        kwargs = {"user": uid, "group": gid, "extra_groups": []}
    try:
        res = subprocess.run(
            argv, capture_output=True, timeout=timeout, cwd="/", env=_base_env("/tmp"), check=False, **kwargs
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.decode("utf-8", "replace").strip()


def _base_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _root_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def _bwrap_prefix(bwrap: str, binds: Sequence[str], limits: SandboxLimits) -> list[str]:
    """bubblewrap arguments: new namespaces (no network), read-only ``/`` and ``/dev``, and the only writable
    places ``/tmp`` and ``/dev/shm``, each a private tmpfs of ``tmpfs_mb``."""
    size = str(int(limits.tmpfs_mb) << 20)
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        *binds,
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", size, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", size, "--tmpfs", "/tmp",
        "--remount-ro", "/",
        "--chdir", "/tmp",
    ]  # fmt: skip


def resolve_isolation(
    user: str | None = SANDBOX_USER, python: str | None = None, use_bwrap: bool | None = None
) -> Isolation:
    """Find the user, interpreter and bubblewrap set-up for sandboxed runs (cached; thread-safe).

    ``use_bwrap``: None = use it when it is installed and works, False = never, True = require it
    (raise :class:`SandboxError` when it is unusable).
    """
    key = (user, python, use_bwrap)
    with _ISO_LOCK:
        if key in _ISOLATION:
            return _ISOLATION[key]
        notes: list[str] = []
        uid = gid = None
        name = pwd.getpwuid(os.getuid()).pw_name if _has_pwent(os.getuid()) else str(os.getuid())
        if os.geteuid() == 0 and user:
            entry = _ensure_user(user) or _ensure_user("nobody")
            if entry is None:
                raise SandboxError(
                    f"cannot create or find an unprivileged user for the sandbox (tried {user!r}, 'nobody'); "
                    f"create one with: useradd --system --no-create-home {user}"
                )
            if entry.pw_name != user:
                notes.append(f"user {user!r} unavailable, using {entry.pw_name!r}")
            uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
        elif os.geteuid() == 0:
            notes.append("running sandboxed code as root (user=None)")
            _warn_once("root", "sandbox: user=None, sandboxed code runs as root")
        else:
            notes.append("not root: sandboxed code runs as the current user")
            _warn_once(
                "nonroot",
                f"sandbox: not running as root, so sandboxed code runs as the current "
                f"user {name!r} (no dedicated unprivileged user)",
            )
        probe = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix)"
        chosen = None
        for cand in _candidate_pythons(python):
            out = _probe([cand, "-S", "-I", "-c", probe], uid, gid)
            if out:
                ver, _, prefix = out.partition("\n")
                if tuple(int(x) for x in ver.split(".")) >= (3, 8):
                    chosen = (cand, ver, prefix.strip())
                    break
        if chosen is None:
            raise SandboxError(
                f"no Python interpreter (>= 3.8) is executable by sandbox user {name!r}; tried "
                f"{_candidate_pythons(python)}. Install a system python3 (e.g. apt-get install python3) "
                f"or pass python=..."
            )
        py, ver, prefix = chosen
        binds = _root_binds()
        for path in {os.path.dirname(os.path.dirname(py)), prefix}:
            if path and not path.startswith("/usr/") and path != "/usr" and os.path.isdir(path):
                binds += ["--ro-bind", path, path]
        bwrap = None
        if use_bwrap is not False:
            found = shutil.which("bwrap")
            if found:
                argv = [*_bwrap_prefix(found, binds, SandboxLimits()), py, "-S", "-I", "-c", "print('ok')"]
                if _probe(argv, uid, gid) == "ok":
                    bwrap = found
                else:
                    notes.append("bwrap is installed but failed to start (user namespaces disabled?)")
            else:
                notes.append("bwrap not installed")
            if bwrap is None:
                if use_bwrap:
                    raise SandboxError(f"bubblewrap required but unusable: {'; '.join(notes)}")
                _warn_once(
                    "bwrap",
                    f"sandbox: {notes[-1]}; running code WITHOUT network / filesystem "
                    "isolation (rlimits, user and timeouts still apply). Install it with: "
                    "apt-get install bubblewrap",
                )
        iso = Isolation(
            python=py,
            python_version=ver,
            uid=uid,
            gid=gid,
            user=name,
            bwrap=bwrap,
            bwrap_binds=tuple(binds),
            notes=tuple(notes),
        )
        _ISOLATION[key] = iso
        return iso


def _has_pwent(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _normalize_output(text: str) -> list[str]:
    """Output comparison rule for stdin/stdout tests: right-strip every line, drop trailing blank lines."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: str, expected: str) -> bool:
    """True when two program outputs are equal up to trailing whitespace on lines and trailing blank lines."""
    return _normalize_output(actual) == _normalize_output(expected)


@dataclass
class Job:
    """One sandboxed run: a program and its tests.

    ``mode="function"``: ``tests`` are Python snippets (``assert`` lines, or a ``check(candidate)``
    definition plus its call) executed after ``program`` and ``setup`` in the same namespace.
    ``mode="stdio"``: ``tests`` are ``(stdin, expected_stdout)`` pairs; ``program`` runs once per pair
    as ``__main__``; ``expected_stdout=None`` only captures the output. ``tag`` appears on the sandboxed
    process's command line (``job-<tag>``), to find it in ``ps``.
    """

    program: str
    tests: Sequence
    mode: str = "function"
    setup: str = ""
    tag: str = field(default_factory=lambda: secrets.token_hex(6))


class Sandbox:
    """Runs :class:`Job` s in isolated processes; :meth:`map` runs many in parallel (threads).

    >>> sb = Sandbox(SandboxLimits(timeout_s=3))
    >>> sb.run_function_tests("def f(x):\\n    return x + 1", ["assert f(1) == 2"]).fraction
    1.0
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        user: str | None = SANDBOX_USER,
        python: str | None = None,
        use_bwrap: bool | None = None,
        workers: int | None = None,
        use_launcher: bool = True,
    ):
        self.limits = limits or SandboxLimits()
        self.use_launcher = use_launcher
        self._user, self._python, self._use_bwrap = user, python, use_bwrap
        self.workers = max(1, workers or os.cpu_count() or 1)

    @property
    def isolation(self) -> Isolation:
        """How this sandbox runs code here (resolved once, cached)."""
        return resolve_isolation(self._user, self._python, self._use_bwrap)

    # ---------------------------------------------------------------------------------------------
    def run_function_tests(self, program: str, tests: Sequence[str], setup: str = "") -> ExecResult:
        """Run ``program`` then each test snippet; test ``i`` passes when it completes without raising."""
        return self.run(Job(program, list(tests), "function", setup))

    def run_stdio_tests(self, program: str, cases: Sequence[tuple[str, str | None]]) -> ExecResult:
        """Run ``program`` once per ``(stdin, expected_stdout)`` case; see :func:`outputs_match`."""
        return self.run(Job(program, list(cases), "stdio"))

    def map(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run many jobs, ``self.workers`` at a time; results in input order."""
        if len(jobs) <= 1 or self.workers == 1:
            return [self.run(j) for j in jobs]
        self.isolation  # resolve once before the threads start  # noqa: B018
        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(self.run, jobs))

    # ---------------------------------------------------------------------------------------------
    def run(self, job: Job) -> ExecResult:
        """Run one job and return its per-test verdicts (never raises for anything the program does)."""
        iso = self.isolation
        lim = self.limits
        if job.mode not in ("function", "stdio"):
            raise ValueError(f"unknown sandbox job mode {job.mode!r} (use 'function' or 'stdio')")
        nonce = secrets.token_hex(16)
        tests = [str(t[0]) for t in job.tests] if job.mode == "stdio" else [str(t) for t in job.tests]
        job_data = {
            "nonce": nonce,
            "mode": job.mode,
            "program": job.program,
            "setup": job.setup,
            "tests": tests,
            "output_cap": lim.output_bytes,
            "nproc": lim.nproc if iso.bwrap else None,
            "test_timeout": lim.test_timeout_s,
        }
        payload = marshal.dumps(job_data, 4)
        launcher = _launcher_for(iso) if self.use_launcher else None
        workdir = None
        if iso.bwrap:
            cwd, env = "/tmp", _base_env("/tmp")
            argv = [*_bwrap_prefix(iso.bwrap, iso.bwrap_binds, lim), iso.python]
        else:
            workdir = tempfile.mkdtemp(prefix="dllm-sandbox-")
            if iso.uid is not None:
                os.chown(workdir, iso.uid, iso.gid if iso.gid is not None else -1)
            os.chmod(workdir, 0o700)
            cwd, env = workdir, _base_env(workdir)
            argv = [iso.python]
        # RLIMIT_NPROC counts every process of the user. Under bwrap the harness sets the real limit
        # inside its user namespace (per sandbox); outside it only caps all sandboxes of this user.
        nproc = lim.nproc
        if iso.bwrap:
            nproc = max(16 * lim.nproc, 1024)
        elif iso.uid is None:
            nproc += _count_user_processes(os.getuid())
        rlimits = [(k, nproc if k == "RLIMIT_NPROC" else v) for k, v in lim.rlimits()]
        base = {
            "env": env,
            "cwd": cwd,
            "uid": iso.uid,
            "gid": iso.gid,
            "rlimits": rlimits,
            "timeout": float(lim.timeout_s),
        }
        harness = ["-S", "-I", "-B", "-c", _HARNESS]
        start = time.monotonic()
        pipes = [os.pipe() for _ in range(5)]  # stdin, stdout, stderr, markers, status
        child_ends = [pipes[0][0]] + [w for _, w in pipes[1:]]
        host_ends = [pipes[0][1]] + [r for r, _ in pipes[1:]]
        try:
            kill = None
            if launcher is not None:  # the launcher puts the marker pipe on fd 3
                cfg = {**base, "argv": argv + harness + ["3", f"job-{job.tag}"]}
                kill = launcher.launch(cfg, child_ends)
            if kill is None:  # no launcher (or it failed): one Popen'd reaper for this run
                marker_w, status_w = child_ends[3], child_ends[4]
                cfg = {
                    **base,
                    "argv": argv + harness + [str(marker_w), f"job-{job.tag}"],
                    "status_fd": status_w,
                }
                try:
                    proc = subprocess.Popen(
                        [iso.python, "-S", "-I", "-B", "-c", _REAPER, marshal.dumps(cfg, 4).hex()],
                        stdin=child_ends[0],
                        stdout=child_ends[1],
                        stderr=child_ends[2],
                        pass_fds=(marker_w, status_w),
                        start_new_session=True,
                        cwd="/",
                        env=_base_env("/tmp"),
                    )
                except OSError as exc:
                    raise SandboxError(f"cannot start the sandbox reaper with {iso.python}: {exc}") from exc
                kill = _popen_killer(proc)
            for fd in child_ends:
                os.close(fd)
            child_ends = []
            pumped, host_ends = host_ends, []
            bufs = _pump(pumped, payload, lim, len(job.tests), start, kill)
        finally:
            for fd in child_ends + host_ends:
                try:
                    os.close(fd)
                except OSError:
                    pass
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        duration = time.monotonic() - start
        out, err, markers, status_raw, truncated, host_timeout = bufs
        status_line = status_raw.decode("utf-8", "replace").strip()
        if status_line.startswith("E "):
            raise SandboxError(f"sandbox failed to start the program: {status_line[2:]}")
        if status_line.startswith("S "):
            status = status_line[2:]
        else:
            status = "reaper died" if not host_timeout else "killed by host timeout"
        timed_out = host_timeout or status.endswith(" timeout")
        passed, details, outputs = self._verdicts(job, markers, nonce.encode(), timed_out)
        return ExecResult(
            passed=passed,
            details=details,
            outputs=outputs,
            status=status,
            timed_out=timed_out,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            truncated=truncated,
            duration_s=duration,
        )

    @staticmethod
    def _verdicts(job: Job, markers: bytes, nonce: bytes, timed_out: bool):
        n = len(job.tests)
        passed = [False] * n
        details = ["not run" + (" (timeout)" if timed_out else "")] * n
        outputs: list[str | None] = [None] * n
        seen = [False] * n
        pos = 0
        prefix = nonce + b" "
        while pos < len(markers):
            if not markers.startswith(prefix, pos):
                nxt = markers.find(b"\n" + prefix, pos)
                if nxt < 0:
                    break
                pos = nxt + 1
                continue
            nl = markers.find(b"\n", pos)
            if nl < 0:
                break
            parts = markers[pos:nl].split(b" ")
            try:
                i, status, dlen, olen = int(parts[1]), parts[2], int(parts[3]), int(parts[4])
            except (IndexError, ValueError):
                pos = nl + 1
                continue
            detail = markers[nl + 1 : nl + 1 + dlen].decode("utf-8", "replace")
            output = markers[nl + 1 + dlen : nl + 1 + dlen + olen].decode("utf-8", "replace")
            pos = nl + 1 + dlen + olen
            if not 0 <= i < n or seen[i]:
                continue
            seen[i] = True
            if job.mode == "function":
                passed[i] = status == b"ok"
                details[i] = "ok" if passed[i] else (detail or "failed")
            else:
                outputs[i] = output
                expected = job.tests[i][1]
                if expected is None:
                    passed[i] = detail == "exit 0"
                    details[i] = detail
                elif detail != "exit 0":
                    details[i] = f"runtime error ({detail})"
                elif outputs_match(output, str(expected)):
                    passed[i] = True
                    details[i] = "ok"
                else:
                    details[i] = f"wrong output: got {output[:80]!r}, expected {str(expected)[:80]!r}"
        return passed, details, outputs


def _popen_killer(proc: subprocess.Popen) -> Callable[..., None]:
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


def _pid_killer(pid: int) -> Callable[..., None]:
    """Kill function for a launcher-forked reaper (own session; the launcher's kernel auto-reap frees it)."""

    def kill(final: bool = False) -> None:
        if not final:
            for fn in (os.killpg, os.kill):
                try:
                    fn(pid, signal.SIGKILL)
                except OSError:
                    pass

    return kill


def _pump(
    host_ends: list[int],
    payload: bytes,
    lim: SandboxLimits,
    n_tests: int,
    start: float,
    kill: Callable[..., None],
) -> tuple[bytes, bytes, bytes, bytes, bool, bool]:
    """Feed the job to the sandbox and collect stdout, stderr, markers and status until every pipe is closed
    (every sandbox process is gone); output beyond the caps is read and discarded. Closes the fds."""
    stdin_w, out_r, err_r, mark_r, stat_r = host_ends
    cap = lim.output_bytes
    caps = {out_r: cap, err_r: cap, mark_r: n_tests * (cap + 1024) + 4096, stat_r: 4096}
    bufs = {fd: bytearray() for fd in caps}
    truncated = False
    sel = selectors.DefaultSelector()
    os.set_blocking(stdin_w, False)
    sel.register(stdin_w, selectors.EVENT_WRITE)
    for fd in caps:
        sel.register(fd, selectors.EVENT_READ)
    view = memoryview(payload)
    open_reads = len(caps)
    stdin_open = True
    host_deadline = start + lim.timeout_s + 10.0
    host_timeout = False
    try:
        while open_reads:
            left = host_deadline - time.monotonic()
            if left <= 0:
                host_timeout = True
                kill()
                break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                fd = key.fd
                if fd == stdin_w:
                    try:
                        view = view[os.write(stdin_w, view[:65536]) :]
                    except OSError:
                        view = view[:0]
                    if not len(view):
                        sel.unregister(stdin_w)
                        os.close(stdin_w)
                        stdin_open = False
                    continue
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                    open_reads -= 1
                    continue
                buf = bufs[fd]
                room = caps[fd] - len(buf)
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
    finally:
        sel.close()
        for fd in ([stdin_w] if stdin_open else []) + list(caps):
            try:
                os.close(fd)
            except OSError:
                pass
        kill(final=not host_timeout)
    out = (bytes(bufs[out_r]), bytes(bufs[err_r]), bytes(bufs[mark_r]), bytes(bufs[stat_r]))
    return (*out, truncated, host_timeout)


class _Launcher:
    """Host side of the launcher process (one per isolation set-up and host process)."""

    def __init__(self, iso: Isolation) -> None:
        self.pid_owner = os.getpid()
        self.lock = threading.Lock()
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [iso.python, "-S", "-I", "-B", "-c", _LAUNCHER, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                cwd="/",
                env=_base_env("/tmp"),
            )
        finally:
            theirs.close()
        self.broken = False

    def launch(self, cfg: dict, fds: list[int]) -> Callable[..., None] | None:
        """Ask the launcher to start a reaper for ``cfg`` with these pipe ends; returns a kill function, or
        None when the launcher is not working (the caller then starts a reaper itself)."""
        with self.lock:
            if self.broken:
                return None
            try:
                socket.send_fds(self.sock, [marshal.dumps(cfg, 4)], fds)
                pid = int(self.sock.recv(64))
            except (OSError, ValueError):
                self.broken = True
                _warn_once("launcher", "sandbox: the launcher process stopped; starting one reaper per run")
                return None
        return _pid_killer(pid)

    def close(self) -> None:
        """Close the socket (the launcher exits on EOF) and wait for it."""
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_LAUNCHERS: dict[Isolation, _Launcher] = {}
_LAUNCH_LOCK = threading.Lock()


def _launcher_for(iso: Isolation) -> _Launcher | None:
    if not hasattr(socket, "send_fds") or tuple(map(int, iso.python_version.split("."))) < (3, 9):
        return None
    with _LAUNCH_LOCK:
        la = _LAUNCHERS.get(iso)
        if la is not None and (la.pid_owner != os.getpid() or la.broken or la.proc.poll() is not None):
            la = None  # a forked host process, or a dead launcher: start a fresh one
        if la is None:
            try:
                la = _Launcher(iso)
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


def _count_user_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


_DEFAULT: dict[tuple, Sandbox] = {}


def default_sandbox(limits: SandboxLimits | None = None, workers: int | None = None) -> Sandbox:
    """A shared :class:`Sandbox` with the given limits (one per distinct configuration)."""
    key = (limits, workers)
    if key not in _DEFAULT:
        _DEFAULT[key] = Sandbox(limits, workers=workers)
    return _DEFAULT[key]
