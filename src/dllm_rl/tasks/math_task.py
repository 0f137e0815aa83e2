"""MATH (competition mathematics, e.g. MATH-500), verified with ``math-verify``.

Data: ``problem`` and ``answer`` (MATH-500), or a ``solution`` whose last ``\\boxed{}`` is the answer.
Default file: ``math/math500_test.jsonl`` (split ``test``; there is no train split offline).

Answer extraction: the content of the last complete ``\\boxed{...}`` (nested braces balanced).
Reward: 1.0 when ``math_verify.verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))`` is true
(symbolic / numeric equivalence: ``\\frac{1}{2}`` = ``0.5``, intervals, sets, matrices, ...), else 0.0.
A string-identical answer (after removing spaces, ``\\left`` / ``\\right`` and ``dfrac`` -> ``frac``)
scores 1.0 without calling math-verify (``exact_shortcut=True``).

Before math-verify: a boxed answer longer than ``max_answer_chars`` (default
:data:`~dllm_rl.tasks.extract.MAX_ANSWER_CHARS`, 1000) scores 0 (``answer too long``), and so does one
whose evaluation could not finish (power towers, huge factorials, big symbolic expansions; see
:func:`~dllm_rl.tasks.answer_cost.evaluation_risk`), with the reason ``answer cannot be evaluated in
time: ...``; no verifier call waits on a timeout for such an answer.

math-verify times itself out with ``signal.alarm`` (main thread only) and sympy can hang on adversarial
input, so checks run in a small pool of worker processes (:class:`MathVerifier`); a check that takes
longer than ``timeout_s`` kills its worker (a fresh one replaces it) and scores 0 with reason
``timeout``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from .answer_cost import evaluation_risk
from .base import DataError, Score, Task
from .extract import MAX_ANSWER_CHARS, last_boxed, too_long_reason

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_math_worker.py")


class _Worker:
    def __init__(self, python: str, inner_timeout: int, startup_timeout_s: float) -> None:
        self.proc = subprocess.Popen(
            [python, "-P", "-u", _WORKER, str(inner_timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.buf = b""
        self.next_id = 0
        line = self._readline(time.monotonic() + startup_timeout_s)
        if line != b"ready":
            self.kill()
            raise RuntimeError(
                f"math-verify worker did not start ({python} {_WORKER}); is math-verify "
                "installed (pip install math-verify)?"
            )

    def _readline(self, deadline: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.strip()

    def request(self, req: dict, timeout_s: float) -> dict | None:
        """Send one request; the reply, or None on timeout / worker death (the worker is then dead)."""
        assert self.proc.stdin is not None
        self.next_id += 1
        req = {**req, "id": self.next_id}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._readline(deadline)
            if line is None:
                self.kill()
                return None
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue
            if reply.get("id") == self.next_id:
                return reply

    @property
    def alive(self) -> bool:
        """Whether the worker process is still running."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker's process group and close its pipes."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


class MathVerifier:
    """A small pool of math-verify worker processes with a wall-clock timeout per check.

    ``check_many`` runs up to ``workers`` checks at once (one thread per busy worker). Workers start
    lazily (importing sympy takes about a second) and live until :meth:`close` or interpreter exit.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        python: str | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.workers = max(1, int(workers))
        self.timeout_s = float(timeout_s)
        self.python = python or sys.executable
        self.startup_timeout_s = startup_timeout_s
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._all: list[_Worker] = []
        self._slots = threading.Semaphore(self.workers)
        self._closed = False

    def _get(self) -> _Worker:
        self._slots.acquire()
        try:
            while True:
                try:
                    w = self._idle.get_nowait()
                except queue.Empty:
                    break
                if w.alive:
                    return w
            w = _Worker(self.python, max(1, int(self.timeout_s)), self.startup_timeout_s)
            with self._lock:
                self._all = [x for x in self._all if x.alive] + [w]
            return w
        except BaseException:
            self._slots.release()
            raise

    def _put(self, w: _Worker) -> None:
        if w.alive and not self._closed:
            self._idle.put(w)
        else:
            w.kill()
        self._slots.release()

    def _request(self, req: dict) -> tuple[bool, str]:
        w = self._get()
        try:
            reply = w.request(req, self.timeout_s)
        finally:
            self._put(w)
        if reply is None:
            return False, "timeout"
        if reply.get("ok"):
            return True, "equivalent (math-verify)"
        return False, reply.get("error") or "not equivalent (math-verify)"

    def check(self, gold: str, pred: str) -> tuple[bool, str]:
        """Is ``pred`` mathematically equal to ``gold`` (both LaTeX, without ``\\boxed``)?"""
        return self._request({"gold": gold, "pred": pred})

    def check_many(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[bool, str]]:
        """:meth:`check` for many ``(gold, pred)`` pairs, in parallel; results in input order."""
        if len(pairs) <= 1 or self.workers == 1:
            return [self.check(g, p) for g, p in pairs]
        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            return list(ex.map(lambda gp: self.check(*gp), pairs))

    def sleep(self, seconds: float) -> tuple[bool, str]:
        """Make one worker sleep (for testing the timeout path)."""
        return self._request({"op": "sleep", "seconds": seconds})

    def close(self) -> None:
        """Stop all workers."""
        with self._lock:
            workers, self._all = self._all, []
        for w in workers:
            w.kill()
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break


_VERIFIERS: dict[tuple[int, float], MathVerifier] = {}
_VLOCK = threading.Lock()


def shared_verifier(workers: int = 2, timeout_s: float = 5.0) -> MathVerifier:
    """The process-wide :class:`MathVerifier` for this configuration (created on first use)."""
    with _VLOCK:
        key = (workers, float(timeout_s))
        if key not in _VERIFIERS:
            _VERIFIERS[key] = MathVerifier(workers, timeout_s)
        return _VERIFIERS[key]


@atexit.register
def _close_verifiers() -> None:
    for v in list(_VERIFIERS.values()):
        v.close()


_NORM = re.compile(r"\s+|\\left|\\right|\\!|\\,")


def _canon(s: str) -> str:
    return _NORM.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


class MathTask(Task):
    """Competition math with a boxed final answer, checked by math-verify (see module docstring).

    Extra args: ``workers`` (verifier processes, default 2), ``timeout_s`` per check (default 5),
    ``exact_shortcut`` (default True), ``max_answer_chars`` (longer boxed answers score 0;
    :data:`~dllm_rl.tasks.extract.MAX_ANSWER_CHARS`).
    """

    name: ClassVar[str] = "math"
    required_fields: ClassVar = (("problem", "question", "prompt"), ("answer", "solution"))
    default_files: ClassVar = {"test": "math/math500_test.jsonl"}
    hub_datasets: ClassVar = {"test": "hf:HuggingFaceH4/MATH-500@test"}
    instruction: ClassVar[str] = "Please reason step by step, and put your final answer within \\boxed{}."

    def __init__(
        self,
        data: Any = None,
        *,
        workers: int = 2,
        timeout_s: float = 5.0,
        exact_shortcut: bool = True,
        max_answer_chars: int = MAX_ANSWER_CHARS,
        **kwargs: Any,
    ) -> None:
        super().__init__(data, **kwargs)
        self.workers = workers
        self.timeout_s = timeout_s
        self.exact_shortcut = exact_shortcut
        self.max_answer_chars = max_answer_chars
        self._verifier: MathVerifier | None = None

    @property
    def verifier(self) -> MathVerifier:
        """The shared :class:`MathVerifier` for this task's workers / timeout."""
        if self._verifier is None:
            self._verifier = shared_verifier(self.workers, self.timeout_s)
        return self._verifier

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Use ``answer``, else the last ``\\boxed{}`` of ``solution``."""
        if row.get("answer") is None:
            boxed, _ = last_boxed(str(row["solution"]))
            if boxed is None:
                raise DataError(f"{where}: no field 'answer' and no \\boxed{{}} in field 'solution'")
            row["answer"] = boxed
        row["answer"] = str(row["answer"]).strip()
        if not row["answer"]:
            raise DataError(f"{where}: field 'answer' is empty")
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """The problem followed by the boxed-answer instruction."""
        q = example.get("problem") or example.get("question") or example.get("prompt")
        return f"{str(q).strip()}\n{self.instruction}"

    def extract_answer(self, text: str) -> str | None:
        """Content of the last complete ``\\boxed{}``."""
        return last_boxed(text)[0]

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """A sentence with the reference answer boxed."""
        return f"The final answer is $\\boxed{{{example['answer']}}}$."

    def _gold(self, example: Mapping[str, Any]) -> str | None:
        if example.get("answer") is not None:
            return str(example["answer"]).strip()
        return last_boxed(str(example.get("solution", "")))[0]

    def _precheck(self, text: str, example: Mapping[str, Any]) -> Score | tuple[str, str]:
        gold = self._gold(example)
        if not gold:
            return Score(0.0, "no reference answer in the example")
        pred, status = last_boxed(text)
        if pred is None:
            return Score(
                0.0, "unbalanced \\boxed{ (never closed)" if status == "unbalanced" else "no \\boxed{} answer"
            )
        pred = pred.strip()
        if not pred:
            return Score(0.0, "empty \\boxed{}")
        too_long = too_long_reason(pred, self.max_answer_chars)
        if too_long:
            return Score(0.0, too_long)
        if self.exact_shortcut and _canon(pred) == _canon(gold):
            return Score(1.0, "correct (exact match)")
        risk = evaluation_risk(pred)
        if risk:
            return Score(0.0, risk)
        gold_risk = evaluation_risk(gold)
        if gold_risk:
            return Score(0.0, f"reference {gold_risk}")
        return gold, pred

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        return self._score_batch([text], [dict(example)])[0]

    def _score_batch(self, texts: list[str], examples: list[dict[str, Any]]) -> list[Score]:
        out: list[Score | None] = [None] * len(texts)
        todo: list[tuple[int, tuple[str, str]]] = []
        for i, (t, ex) in enumerate(zip(texts, examples)):
            try:
                r = self._precheck(t, ex)
            except Exception as exc:
                r = Score(0.0, f"reward error: {type(exc).__name__}: {str(exc)[:200]}")
            if isinstance(r, Score):
                out[i] = r
            else:
                todo.append((i, r))
        if todo:
            results = self.verifier.check_many([gp for _, gp in todo])
            for (i, (gold, pred)), (ok, why) in zip(todo, results):
                out[i] = Score(
                    1.0 if ok else 0.0,
                    ("correct: " if ok else "wrong: ")
                    + why
                    + ("" if ok else f" (got {pred[:40]!r}, expected {gold[:40]!r})"),
                )
        return [s if s is not None else Score(0.0, "not scored") for s in out]

    def close(self) -> None:
        """Drop this task's handle on the shared verifier (its workers stop at exit)."""
        self._verifier = None  # shared pools are closed at exit
