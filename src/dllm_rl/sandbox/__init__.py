"""Run untrusted code (model completions) and count the tests it passes.

    sb = Sandbox(SandboxLimits(timeout_s=5))
    sb.run_function_tests("def f(x):\\n    return x + 1", ["assert f(1) == 2"]).fraction   # 1.0

Isolation, outermost first:

1. **Reaper** (:mod:`._child.reaper`). Every run gets an intermediate process in its own session. It
   makes itself a child subreaper, forks the sandboxed process, enforces the wall-clock timeout and, when
   the run ends for any reason, kills the process group and every descendant that was re-parented to it,
   then reaps them: no process or zombie outlives a run. To keep start-up cheap, reapers are forked from a
   small long-lived *launcher* process (:mod:`.launcher`; one per host process, receiving each run's pipes
   over a unix socket); where that is unavailable each run starts its own reaper (``use_launcher=False``).
2. **Unprivileged user** (:mod:`.isolation`, :mod:`.slots`). When the host runs as root, the sandboxed
   processes drop to a dedicated system user (``dllm-sandbox``, created with ``useradd --system`` if
   missing; ``nobody`` if that fails), one uid per concurrent run (``dllm-sandbox-1``, ``-2``, ... in the
   same group), so one run's process limit never touches another's. Not root: they run as the current
   user, and a warning says so once.
3. **rlimits** set before the harness starts: CPU seconds, address space, processes, file size, open
   files, no core dumps (per process: the test process and the program's process each get them).
4. **bubblewrap** (``bwrap``) when installed and usable: new network namespace (only ``lo``), new PID /
   IPC / UTS / user namespaces, a read-only view of ``/usr``, the interpreter's prefix and the
   ``_child`` package only, a read-only ``/`` and ``/dev``, private size-limited tmpfs mounts at ``/tmp``
   (the working directory) and ``/dev/shm``, ``--die-with-parent``. Without bwrap (or where user
   namespaces are disabled) the sandbox degrades to 1-3 in a private temp dir and logs a warning once; the
   code can then reach the network and write where the sandbox user may.
5. **Interpreter.** A Python the sandbox user can execute (the base interpreter of the venv, or
   ``/usr/bin/python3``; checked by running it as that user) started with ``-S -I -B``: no site import,
   isolated mode, so start-up is cheap and no host packages leak in. The child programs (``_child/``) are
   standard-library modules run by file path.

The verdict is out of the program's reach. The harness (:mod:`._child.harness`) reads a per-run random
nonce and the number of a marker pipe; after each test completes it writes ``<nonce> <i> ok`` to that
pipe, and only those markers count (:mod:`.verdicts`), so ``sys.exit(0)``, ``os._exit(0)``, a killed
parent or a crash pass nothing. For function tests the program runs in **its own process**, forked from the
harness before the job (and so the nonce) is read, without the marker pipe; the harness makes itself
non-dumpable first, so the program cannot read its memory or reopen its pipes through ``/proc``. The tests run
in the harness, after the job's trusted *prelude* (HumanEval's prompt: its helpers and imports). The tests see
the program's entry point, and the other names of the program they read that neither a builtin nor the prelude
provides, each a stand-in that sends calls over a dedicated pipe pair and receives plain data back
(:mod:`._child.wire`: None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
frozenset, range, built-in types, Fraction, Decimal, namedtuples, dict views, iterators materialised;
type-tagged): a program that redefines ``abs`` or a prompt helper changes nothing the tests call, and no
object of the program, no ``__eq__`` that always answers True, no function found through ``gc`` or stack
frames, nothing printed to stdout can count as a pass. A function that returns anything else fails that test
(``f(...) returned an object of type Foo, not plain data``); classes are called through handles, and the
program's exceptions arrive as their first built-in base (see :mod:`._child.calls` for what is not supported).
stdin/stdout tests run each case in a forked child without the marker pipe, and the host compares the outputs
itself.
"""

from .isolation import SANDBOX_USER, Isolation, resolve_isolation
from .limits import SandboxError, SandboxLimits
from .runner import Job, Sandbox, default_sandbox
from .verdicts import ExecResult, outputs_match

__all__ = [
    "SANDBOX_USER",
    "ExecResult",
    "Isolation",
    "Job",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "default_sandbox",
    "outputs_match",
    "resolve_isolation",
]
