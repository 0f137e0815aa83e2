"""What a run produced: the per-test verdicts read from the harness's markers, and the output rule of
stdin/stdout tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


def _normalize_output(text: str) -> list[str]:
    """Output comparison rule for stdin/stdout tests: right-strip every line, drop trailing blank lines."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(actual: str, expected: str) -> bool:
    """True when two program outputs are equal up to trailing whitespace on lines and trailing blank lines."""
    return _normalize_output(actual) == _normalize_output(expected)


def read_markers(markers: bytes, nonce: bytes, n: int) -> list[tuple[bytes, str, str] | None]:
    """The first marker of each test ``i < n`` carrying ``nonce``: ``(status, detail, output)`` or None.
    Lines without the nonce (forgeries, junk) are skipped."""
    found: list[tuple[bytes, str, str] | None] = [None] * n
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
        if 0 <= i < n and found[i] is None:
            found[i] = (status, detail, output)
    return found


def verdicts(mode: str, tests: Sequence, markers: bytes, nonce: bytes, timed_out: bool):
    """``(passed, details, outputs)`` per test from the markers of one run."""
    n = len(tests)
    passed = [False] * n
    details = ["not run" + (" (timeout)" if timed_out else "")] * n
    outputs: list[str | None] = [None] * n
    for i, seen in enumerate(read_markers(markers, nonce, n)):
        if seen is None:
            continue
        status, detail, output = seen
        if mode == "function":
            passed[i] = status == b"ok"
            details[i] = "ok" if passed[i] else (detail or "failed")
            continue
        outputs[i] = output
        expected = tests[i][1]
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
