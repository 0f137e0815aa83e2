"""How sandboxed code runs on this host: the unprivileged user, the interpreter, and bubblewrap's
arguments (probed once per process and configuration)."""

from __future__ import annotations

import atexit
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from .limits import SandboxError, SandboxLimits

log = logging.getLogger(__name__)

SANDBOX_USER = "dllm-sandbox"
CHILD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child")
# Where bubblewrap shows Isolation.child_dir inside the sandbox (a fixed place: a copy under the host's /tmp
# would be hidden by the sandbox's private /tmp).
BWRAP_CHILD_DIR = "/run/dllm-sandbox/_child"


@dataclass(frozen=True)
class Isolation:
    """How sandboxed code runs on this host (resolved once per process and configuration).

    ``child_dir``: the ``_child`` package as the sandbox user reads it (this package's own folder, or a
    private readable copy when the user cannot read the installed one); under bubblewrap it is mounted
    read-only at :data:`BWRAP_CHILD_DIR` (see :meth:`harness`).
    """

    python: str
    python_version: str
    uid: int | None
    gid: int | None
    user: str
    bwrap: str | None
    bwrap_binds: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    child_dir: str = CHILD_DIR

    def harness(self) -> str:
        """Path of the test harness as the sandboxed process sees it."""
        return os.path.join(BWRAP_CHILD_DIR if self.bwrap else self.child_dir, "harness.py")

    def describe(self) -> str:
        """One line for logs: interpreter, user, bubblewrap or not."""
        who = f"user {self.user}" + (" (current user)" if self.uid is None else f" (uid {self.uid})")
        box = f"bubblewrap ({self.bwrap})" if self.bwrap else "no bubblewrap (rlimits + user only)"
        return f"python {self.python} ({self.python_version}), {who}, {box}"


_WARNED: set[str] = set()
_ISOLATION: dict[tuple, Isolation] = {}
_ISO_LOCK = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message)


def ensure_user(name: str, gid: int | None = None) -> pwd.struct_passwd | None:
    """Return the passwd entry of ``name``, creating it as a system user (in group ``gid`` when given) when
    root and missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    if os.path.exists(useradd):
        cmd = [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]
        cmd += ["--gid", str(gid)] if gid is not None else []
        subprocess.run([*cmd, name], capture_output=True, timeout=30, check=False)
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
            argv, capture_output=True, timeout=timeout, cwd="/", env=base_env("/tmp"), check=False, **kwargs
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return res.stdout.decode("utf-8", "replace").strip()


def base_env(home: str) -> dict[str, str]:
    """The whole environment of sandboxed processes (nothing of the host's leaks in)."""
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


def bwrap_prefix(bwrap: str, binds: Sequence[str], limits: SandboxLimits) -> list[str]:
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


def _has_pwent(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _sandbox_user(user: str | None, notes: list[str]) -> tuple[int | None, int | None, str]:
    """``(uid, gid, name)`` the code runs as: a dedicated user when root, else the current user (uid None)."""
    name = pwd.getpwuid(os.getuid()).pw_name if _has_pwent(os.getuid()) else str(os.getuid())
    if os.geteuid() == 0 and user:
        entry = ensure_user(user) or ensure_user("nobody")
        if entry is None:
            raise SandboxError(
                f"cannot create or find an unprivileged user for the sandbox (tried {user!r}, 'nobody'); "
                f"create one with: useradd --system --no-create-home {user}"
            )
        if entry.pw_name != user:
            notes.append(f"user {user!r} unavailable, using {entry.pw_name!r}")
        return entry.pw_uid, entry.pw_gid, entry.pw_name
    if os.geteuid() == 0:
        notes.append("running sandboxed code as root (user=None)")
        warn_once("root", "sandbox: user=None, sandboxed code runs as root")
    else:
        notes.append("not root: sandboxed code runs as the current user")
        warn_once(
            "nonroot",
            f"sandbox: not running as root, so sandboxed code runs as the current user {name!r} "
            "(no dedicated unprivileged user)",
        )
    return None, None, name


def _choose_python(python: str | None, uid: int | None, gid: int | None, name: str) -> tuple[str, str, str, bool]:
    """``(path, "3.x", base prefix, reads_child_dir)`` of the first interpreter (>= 3.8) the user can run."""
    probe = (
        "import os, sys; print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix); "
        f"print(os.access({os.path.join(CHILD_DIR, 'harness.py')!r}, os.R_OK))"
    )
    for cand in _candidate_pythons(python):
        out = _probe([cand, "-S", "-I", "-c", probe], uid, gid)
        if out and out.count("\n") == 2:
            ver, prefix, readable = out.split("\n")
            if tuple(int(x) for x in ver.split(".")) >= (3, 8):
                return cand, ver, prefix.strip(), readable.strip() == "True"
    raise SandboxError(
        f"no Python interpreter (>= 3.8) is executable by sandbox user {name!r}; tried "
        f"{_candidate_pythons(python)}. Install a system python3 (e.g. apt-get install python3) or pass python=..."
    )


def _readable_copy() -> str:
    """A private copy of the ``_child`` package that any user can read (removed when this process exits)."""
    root = tempfile.mkdtemp(prefix="dllm-sandbox-child-")
    os.chmod(root, 0o755)
    dst = os.path.join(root, "_child")
    os.mkdir(dst)
    os.chmod(dst, 0o755)
    for name in os.listdir(CHILD_DIR):
        if name.endswith(".py"):
            shutil.copyfile(os.path.join(CHILD_DIR, name), os.path.join(dst, name))
            os.chmod(os.path.join(dst, name), 0o644)
    atexit.register(shutil.rmtree, root, True)
    return dst


def _precompile(py: str, child_dir: str) -> None:
    """Byte-compile the ``_child`` modules for the sandbox interpreter (it runs with ``-B``, so it reads
    ``__pycache__`` but never writes it): saves compiling them at every run. Best effort: a read-only
    install just compiles them each time."""
    try:
        subprocess.run(
            [py, "-S", "-I", "-m", "compileall", "-q", child_dir],
            capture_output=True, timeout=60, cwd="/", env=base_env("/tmp"), check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass


def _find_bwrap(use_bwrap: bool | None, binds: list[str], py: str, uid, gid, notes: list[str]):
    """bubblewrap's path when it is wanted and starts the interpreter (reading the child programs), else None."""
    if use_bwrap is False:
        return None
    found = shutil.which("bwrap")
    if found:
        check = f"import os; print('ok' if os.access({BWRAP_CHILD_DIR + '/harness.py'!r}, os.R_OK) else 'no')"
        argv = [*bwrap_prefix(found, binds, SandboxLimits()), py, "-S", "-I", "-c", check]
        if _probe(argv, uid, gid) == "ok":
            return found
        notes.append("bwrap is installed but failed to start (user namespaces disabled?)")
    else:
        notes.append("bwrap not installed")
    if use_bwrap:
        raise SandboxError(f"bubblewrap required but unusable: {'; '.join(notes)}")
    warn_once(
        "bwrap",
        f"sandbox: {notes[-1]}; running code WITHOUT network / filesystem isolation (rlimits, user and "
        "timeouts still apply). Install it with: apt-get install bubblewrap",
    )
    return None


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
        uid, gid, name = _sandbox_user(user, notes)
        py, ver, prefix, reads_child = _choose_python(python, uid, gid, name)
        child_dir = CHILD_DIR if reads_child else _readable_copy()
        _precompile(py, child_dir)
        if not reads_child:
            notes.append(f"user {name!r} cannot read {CHILD_DIR}; using a private copy at {child_dir}")
        binds = _root_binds()
        for path in {os.path.dirname(os.path.dirname(py)), prefix}:
            if path and not path.startswith("/usr/") and path != "/usr" and os.path.isdir(path):
                binds += ["--ro-bind", path, path]
        binds += ["--ro-bind", child_dir, BWRAP_CHILD_DIR]
        bwrap = _find_bwrap(use_bwrap, binds, py, uid, gid, notes)
        iso = Isolation(py, ver, uid, gid, name, bwrap, tuple(binds), tuple(notes), child_dir)
        _ISOLATION[key] = iso
        return iso
