"""Running one job: the harness's command line, the pipes to it, pumping input and output until every
sandboxed process is gone, and the verdicts from its markers."""

from __future__ import annotations

import marshal
import os
import secrets
import selectors
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .isolation import SANDBOX_USER, Isolation, base_env, bwrap_prefix, resolve_isolation
from .launcher import launcher_for, popen_reaper
from .limits import SandboxError, SandboxLimits
from .slots import run_uid
from .verdicts import ExecResult, verdicts


@dataclass
class Job:
    """One sandboxed run: a program and its tests.

    ``mode="function"``: ``tests`` are Python snippets (``assert`` lines, or a ``check(candidate)``
    definition plus its call) run after ``setup`` in a namespace holding the trusted ``prelude``'s names
    (HumanEval's prompt: its helpers), then the program's ``entry_point`` and the other names of the
    program the tests read that neither a builtin nor the prelude provides (the program itself runs in its
    own process; see :mod:`dllm_rl.sandbox`).
    ``mode="stdio"``: ``tests`` are ``(stdin, expected_stdout)`` pairs; ``program`` runs once per pair
    as ``__main__``; ``expected_stdout=None`` only captures the output. ``tag`` appears on the sandboxed
    process's command line (``job-<tag>``), to find it in ``ps``.
    """

    program: str
    tests: Sequence
    mode: str = "function"
    setup: str = ""
    tag: str = field(default_factory=lambda: secrets.token_hex(6))
    entry_point: str | None = None
    prelude: str = ""


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

    def run_function_tests(
        self, program: str, tests: Sequence[str], setup: str = "", entry_point: str | None = None, prelude: str = ""
    ) -> ExecResult:
        """Run ``program`` then each test snippet; test ``i`` passes when it completes without raising."""
        return self.run(Job(program, list(tests), "function", setup, entry_point=entry_point, prelude=prelude))

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

    def _config(self, iso: Isolation, workdir: str | None, uid: int | None) -> tuple[dict, list[str], int]:
        """The reaper's config (no argv yet), the command up to the harness, and the harness's nproc."""
        lim = self.limits
        if iso.bwrap:
            cwd, env = "/tmp", base_env("/tmp")
            argv = [*bwrap_prefix(iso.bwrap, iso.bwrap_binds, lim), iso.python]
        else:
            cwd, env = workdir, base_env(workdir)
            argv = [iso.python]
        # RLIMIT_NPROC counts every process of the user. As root each run has a uid of its own (:mod:`.slots`);
        # under bwrap the harness also sets the real limit inside its user namespace (per sandbox). Not root
        # and without bwrap it caps all sandboxes of the current user together.
        nproc = lim.nproc
        if iso.bwrap:
            nproc = max(16 * lim.nproc, 1024)
        elif uid is None:
            nproc += _count_user_processes(os.getuid())
        rlimits = [(k, nproc if k == "RLIMIT_NPROC" else v) for k, v in lim.rlimits()]
        cfg = {"env": env, "cwd": cwd, "uid": uid, "gid": iso.gid, "rlimits": rlimits}
        cfg["timeout"] = float(lim.timeout_s)
        argv += ["-S", "-I", "-B", iso.harness()]
        return cfg, argv, lim.nproc if iso.bwrap else 0

    def _private_workdir(self, iso: Isolation, uid: int | None) -> str | None:
        if iso.bwrap:
            return None
        workdir = tempfile.mkdtemp(prefix="dllm-sandbox-")
        if uid is not None:
            os.chown(workdir, uid, iso.gid if iso.gid is not None else -1)
        os.chmod(workdir, 0o700)
        return workdir

    def run(self, job: Job) -> ExecResult:
        """Run one job and return its per-test verdicts (never raises for anything the program does)."""
        with run_uid(self.isolation) as uid:
            return self._run(job, uid)

    def _run(self, job: Job, uid: int | None) -> ExecResult:
        iso = self.isolation
        lim = self.limits
        if job.mode not in ("function", "stdio"):
            raise ValueError(f"unknown sandbox job mode {job.mode!r} (use 'function' or 'stdio')")
        nonce = secrets.token_hex(16)
        tests = [str(t[0]) for t in job.tests] if job.mode == "stdio" else [str(t) for t in job.tests]
        job_data = {"nonce": nonce, "program": job.program, "setup": job.setup, "tests": tests}
        job_data.update(entry_point=job.entry_point, prelude=job.prelude)
        job_data.update(output_cap=lim.output_bytes, test_timeout=lim.test_timeout_s)
        payload = marshal.dumps(job_data, 4)
        launcher = launcher_for(iso) if self.use_launcher else None
        workdir = self._private_workdir(iso, uid)
        base, argv, nproc = self._config(iso, workdir, uid)
        tail = [job.mode, str(nproc), f"job-{job.tag}"]
        start = time.monotonic()
        pipes = [os.pipe() for _ in range(5)]  # stdin, stdout, stderr, markers, status
        child_ends = [pipes[0][0]] + [w for _, w in pipes[1:]]
        host_ends = [pipes[0][1]] + [r for r, _ in pipes[1:]]
        try:
            kill = None
            if launcher is not None:  # the launcher puts the marker pipe on fd 3
                kill = launcher.launch({**base, "argv": [*argv, "3", *tail]}, child_ends)
            if kill is None:  # no launcher (or it failed): one Popen'd reaper for this run
                kill = popen_reaper(iso, {**base, "argv": [*argv, str(child_ends[3]), *tail]}, child_ends)
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
        return _result(job, bufs, nonce, time.monotonic() - start)


def _result(job: Job, bufs: tuple, nonce: str, duration: float) -> ExecResult:
    out, err, markers, status_raw, truncated, host_timeout = bufs
    status_line = status_raw.decode("utf-8", "replace").strip()
    if status_line.startswith("E "):
        raise SandboxError(f"sandbox failed to start the program: {status_line[2:]}")
    if status_line.startswith("S "):
        status = status_line[2:]
    else:
        status = "reaper died" if not host_timeout else "killed by host timeout"
    timed_out = host_timeout or status.endswith(" timeout")
    passed, details, outputs = verdicts(job.mode, job.tests, markers, nonce.encode(), timed_out)
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


_DEFAULT: dict[tuple, Sandbox] = {}


def default_sandbox(limits: SandboxLimits | None = None, workers: int | None = None) -> Sandbox:
    """A shared :class:`Sandbox` with the given limits (one per distinct configuration)."""
    key = (limits, workers)
    if key not in _DEFAULT:
        _DEFAULT[key] = Sandbox(limits, workers=workers)
    return _DEFAULT[key]
