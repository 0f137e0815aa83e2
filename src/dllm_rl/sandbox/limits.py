"""Resource limits of one sandboxed run, and the error raised when the sandbox itself cannot run."""

from __future__ import annotations

import math
from dataclasses import dataclass


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the program under test): a set-up problem to fix."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run (all tests of one program).

    ``timeout_s`` is wall-clock time for the whole run; ``cpu_s`` defaults to ``ceil(timeout_s) + 1``.
    ``memory_mb`` caps the address space (RLIMIT_AS) of each sandboxed process, ``nproc`` the processes of one
    run (its own uid as root, its own user namespace under bubblewrap; not root and without bubblewrap, all
    runs of the current user together), ``fsize_mb`` any single file written, ``nofile`` open descriptors,
    ``output_bytes`` how much of stdout / stderr / each test's output is kept (the rest is read and
    discarded), ``tmpfs_mb`` the size of the private ``/tmp`` under bubblewrap. ``test_timeout_s`` bounds each
    stdin/stdout case.
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
