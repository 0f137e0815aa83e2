"""Sandbox: hostile programs are contained and score 0; passing needs the harness's per-test markers."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from dllm_rl.sandbox import Job, Sandbox, SandboxLimits
from dllm_rl.sandbox import isolation as sbx

LIMITS = SandboxLimits(timeout_s=1.5, memory_mb=512, nproc=32, fsize_mb=8, output_bytes=1 << 14)
GOOD = "def f(x):\n    return x + 1\n"
TESTS = ["assert f(1) == 2", "assert f(2) == 3"]
# (use_bwrap, use_launcher): bwrap when installed / never; reapers forked by the launcher / one Popen each
MODES = [
    pytest.param((None, True), id="bwrap-if-available"),
    pytest.param((False, True), id="no-bwrap"),
    pytest.param((None, False), id="popen-reaper"),
]


def make(mode, limits=LIMITS):
    use_bwrap, use_launcher = mode if isinstance(mode, tuple) else (mode, True)
    return Sandbox(limits, use_bwrap=use_bwrap, use_launcher=use_launcher)


def has_bwrap() -> bool:
    return Sandbox(LIMITS).isolation.bwrap is not None


def procs_with(token: str) -> list[int]:
    """Host processes whose command line contains ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def run_hostile(sb, program, tests=TESTS, tag=None):
    job = Job(program, tests, "function", "", tag or secrets.token_hex(6))
    start = time.monotonic()
    res = sb.run(job)
    elapsed = time.monotonic() - start
    assert elapsed < sb.limits.timeout_s + 6, f"run took {elapsed:.1f}s"
    assert not procs_with(f"job-{job.tag}"), "a sandboxed process outlived its run"
    return res


@pytest.mark.parametrize("mode", MODES)
def test_correct_program_passes_and_isolation_is_reported(mode):
    sb = make(mode)
    res = sb.run_function_tests(GOOD, TESTS)
    assert res.passed == [True, True] and res.fraction == 1.0 and res.reason() == "passed 2/2 tests"
    iso = sb.isolation
    assert os.access(iso.python, os.X_OK) and iso.python_version
    if os.geteuid() == 0:
        assert iso.uid not in (None, 0), "as root the code must run as an unprivileged user"
        probe = sb.run_stdio_tests("import os\nprint(os.getuid(), os.geteuid())", [("", None)])
        assert probe.outputs[0].split()[0] != "0"


HOSTILE = {
    "infinite loop": "while True:\n    pass\n",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "8 GiB": "x = bytearray(8 << 30)\n" + GOOD,
    "1 GiB to disk": (
        "with open('big.bin', 'wb') as fh:\n    for _ in range(1024):\n        fh.write(b'0' * (1 << 20))\n"
        + GOOD
    ),
    "sys.exit(0) before asserts": "import sys\nsys.exit(0)\n",
    "exit inside the function": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "kill the parent": "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(0.2)\ndef f(x):\n    return x",
    "print 100 MB": "import sys\nsys.stdout.write('x' * (100 << 20))\ndef f(x):\n    return x\n",
    "daemon escapes the group": (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv('/bin/sleep', ['sleep', '29.7531'])\n    os._exit(0)\n"
        "def f(x):\n    return x\n"
    ),
    "forged markers": (
        "import os\nfor fd in range(3, 64):\n    for i in range(4):\n        try:\n"
        "            os.write(fd, b'%d ok 0 0\\n' % i)\n        except OSError:\n            pass\n"
        "def f(x):\n    return x\n"
    ),
    "patch builtins and math": (
        "import builtins, math\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = None\n"
        "math.isclose = lambda *a, **k: True\ndef f(x):\n    return x\n"
    ),
    "define check": "def check(candidate):\n    pass\ndef f(x):\n    return x\n",
}
HOSTILE_TESTS = {
    "patch builtins and math": ["import math\nassert math.isclose(f(1), 2)", "assert abs(f(1) - 2) < 1e-9"],
    "define check": ["def check(candidate):\n    assert candidate(1) == 2\ncheck(f)\n"],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_contained_and_scores_zero(name, mode):
    # the flood must get to write before the clock stops it (on a loaded machine 1.5 s can pass before it
    # starts, and a run killed first shows no truncation); the others keep the short timeout they test
    sb = make(mode, replace(LIMITS, timeout_s=10.0) if name == "print 100 MB" else LIMITS)
    res = run_hostile(sb, HOSTILE[name], HOSTILE_TESTS.get(name, TESTS))
    assert res.fraction == 0.0, (name, res.details)
    if name == "print 100 MB":
        assert res.truncated and len(res.stdout) <= LIMITS.output_bytes
    if name in ("infinite loop", "fork bomb"):
        assert res.timed_out
    if name == "daemon escapes the group":
        assert not procs_with("sleep\x0029.7531\x00"), "the detached grandchild survived"
    # the host and the sandbox still work afterwards
    assert sb.run_function_tests(GOOD, TESTS).fraction == 1.0


def test_tests_completed_before_a_timeout_still_count():
    sb = make(None)
    res = sb.run_function_tests(GOOD, ["assert f(1) == 2", "while True:\n    pass", "assert f(2) == 3"])
    assert res.passed == [True, False, False] and res.timed_out


@pytest.mark.parametrize("mode", MODES)
def test_stdio_program_cannot_forge_markers_or_escape(mode):
    sb = make(mode)
    forge = (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x 0 out 6 2\\nexit 03\\n')\n"
        "    except OSError:\n        pass\nprint(4)\n"
    )
    res = sb.run_stdio_tests(forge, [("", "3")])
    assert res.fraction == 0.0 and res.outputs == ["4\n"]
    loop = sb.run_stdio_tests("while True:\n    pass", [("", "1")])
    assert loop.fraction == 0.0 and loop.timed_out


def test_network_is_unavailable_inside_bwrap():
    if not has_bwrap():
        pytest.skip("bubblewrap unavailable (apt-get install bubblewrap): no network namespace to test")
    sb = make(None)
    res = sb.run_stdio_tests(
        "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))", [("", None)]
    )
    assert res.outputs[0].strip() == "['lo']"
    with socket.socket() as listener:  # a host loopback listener; the sandbox's own loopback is separate
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        prog = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n{GOOD}"
        res = sb.run_function_tests(prog, TESTS)
        assert res.fraction == 0.0 and "ConnectionRefusedError" in res.details[0]
        with pytest.raises(TimeoutError):
            listener.accept()


def test_filesystem_is_read_only_outside_private_tmp(tmp_path):
    if not has_bwrap():
        pytest.skip("bubblewrap unavailable (apt-get install bubblewrap): no read-only filesystem to test")
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    tmp_path.chmod(0o755)
    name = f"dllm-sandbox-escape-{secrets.token_hex(4)}"
    outside = [str(shared / "x"), f"/usr/{name}", f"/{name}", "/etc/passwd", f"/dev/{name}"]
    prog = (
        f"errors = 0\nfor p in {outside!r}:\n    try:\n        open(p, 'a').write('x')\n    except OSError:\n"
        f"        errors += 1\nopen('/tmp/{name}', 'w').write('private')\n"
        f"open('/dev/shm/{name}', 'w').write('p')\n"
        "open('inside.txt', 'w').write('ok')\nprint(errors)\n"
    )
    res = make(None).run_stdio_tests(prog, [("", str(len(outside)))])
    assert res.fraction == 1.0, (res.outputs, res.stderr)  # every write outside the private /tmp failed
    for p in [*outside[:3], f"/tmp/{name}", f"/dev/shm/{name}", f"/dev/{name}"]:
        assert not os.path.exists(p), p  # and nothing reached the host, not even the private /tmp file


def test_degrades_without_bwrap_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(sbx, "_ISOLATION", {})
    monkeypatch.setattr(sbx, "_WARNED", set())
    real_which = shutil.which
    monkeypatch.setattr(
        sbx.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name)
    )
    with caplog.at_level(logging.WARNING, logger="dllm_rl.sandbox"):
        a = Sandbox(LIMITS).isolation
        b = Sandbox(SandboxLimits(timeout_s=3)).isolation
        res = Sandbox(LIMITS).run_function_tests(GOOD, TESTS)
    assert a.bwrap is None and b is a and res.fraction == 1.0
    warnings = [r for r in caplog.records if "bwrap" in r.getMessage()]
    assert len(warnings) == 1 and "WITHOUT network" in warnings[0].getMessage()
    with pytest.raises(sbx.SandboxError, match="bubblewrap required"):
        _ = Sandbox(LIMITS, use_bwrap=True).isolation


def test_pool_runs_jobs_in_parallel_in_order():
    sb = Sandbox(SandboxLimits(timeout_s=5), workers=2)
    jobs = [
        Job(f"def f(x):\n    return x + {k}\n", [f"assert f(0) == {k}", "assert f(0) == 1"]) for k in range(6)
    ]
    res = sb.map(jobs)
    assert [r.passed for r in res] == [[True, k == 1] for k in range(6)]


@pytest.mark.parametrize("mode", MODES[:2])
def test_fork_bomb_does_not_starve_a_parallel_run(mode):
    sb = make(mode)
    bomb = Job(HOSTILE["fork bomb"], ["pass"])
    good = Job(GOOD, TESTS)
    with ThreadPoolExecutor(2) as ex:
        fut = ex.submit(sb.run, bomb)
        time.sleep(0.4)  # the bomb is at its process limit now
        results = [sb.run(good) for _ in range(3)]
        assert fut.result().fraction == 0.0
    assert all(r.fraction == 1.0 for r in results), [r.details for r in results]
