"""The engine's thread: the only one that touches the model. It takes requests and aborts from a thread-safe
queue, steps the engine while anything is held, and hands each request's events to its asyncio queue.

Events a request receives, in order: ``("text", ids)`` whenever its answer's settled prefix grew (streaming
requests only: the committed tokens before the first masked slot, :meth:`Sequence.settled`), then one of
``("done", rollout)`` or ``("error", message)``. A request's decoding depends on itself alone (the engine's batch
invariance), so concurrent requests get what they would get one at a time.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.engine import Engine

IDLE_WAIT_S = 0.05  # how long the idle thread blocks on its inbox before checking whether to stop


@dataclass
class Ticket:
    """One HTTP request held by the worker: what to decode and where its events go."""

    prompt: list[int]
    config: DecodeConfig
    gen_length: int
    seed: int
    stream: bool
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    request_id: int | None = None
    sent: int = 0  # settled tokens already sent (streaming)
    arrived: float = field(default_factory=time.monotonic)

    def put(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


@dataclass
class Counters:
    """What ``/metrics`` reports (written by the worker and the app; ints, so reads need no lock)."""

    requests: int = 0
    finished: int = 0
    rejected_queue_full: int = 0
    rejected_invalid: int = 0
    aborted_disconnect: int = 0
    timed_out: int = 0
    failed_shutdown: int = 0
    steps: int = 0
    tokens: int = 0


class Worker:
    """Runs ``engine`` on a thread (see the module docstring); :meth:`submit` and :meth:`abort` are thread-safe."""

    def __init__(self, engine: Engine, eos: int):
        self.engine, self.eos = engine, eos
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.tickets: dict[int, Ticket] = {}
        self.counters = Counters()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dllm-rl-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, ticket: Ticket) -> None:
        self.inbox.put(("add", ticket))

    def abort(self, ticket: Ticket, why: str) -> None:
        """Free ``ticket``'s slot (its client is gone or its time is up); ``why`` names the counter."""
        self.inbox.put(("abort", (ticket, why)))

    def stop(self, reason: str = "the server is shutting down") -> None:
        """Stop the thread; every request still held gets ``("error", reason)``."""
        self._stop.set()
        self._thread.join()
        for ticket in self.tickets.values():
            self.counters.failed_shutdown += 1
            ticket.put("error", reason)
        self.tickets.clear()

    @property
    def running(self) -> int:
        return sum(s is not None for s in self.engine.running)

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    # ---- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if self.engine.has_unfinished():
                self._step()

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, value = item
            if kind == "add":
                self._add(value)
            else:
                self._abort(*value)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, ticket: Ticket) -> None:
        try:
            ticket.request_id = self.engine.add_request(ticket.prompt, seed=ticket.seed, gen_length=ticket.gen_length,
                                                        config=ticket.config)
        except ValueError as err:  # UserError / FieldError: checked by the app before, so rare
            ticket.put("error", str(err))
            return
        self.tickets[ticket.request_id] = ticket

    def _abort(self, ticket: Ticket, why: str) -> None:
        if ticket.request_id is not None and self.tickets.pop(ticket.request_id, None) is not None:
            self.engine.abort(ticket.request_id)
            setattr(self.counters, why, getattr(self.counters, why) + 1)

    def _step(self) -> None:
        try:
            finished = self.engine.step()
        except Exception as err:  # a bug or a device error: fail what is held rather than hang it
            for ticket in self.tickets.values():
                ticket.put("error", f"decoding failed: {type(err).__name__}: {err}")
            self.tickets.clear()
            for seq in self.engine.running:
                if seq is not None:
                    self.engine.abort(seq.request_id)
            self.engine.waiting.clear()
            return
        self.counters.steps += 1
        for done in finished:
            ticket = self.tickets.pop(done.request_id, None)
            if ticket is not None:
                self.counters.finished += 1
                self.counters.tokens += int(done.rollout.completion_mask.sum())
                ticket.put("done", done.rollout)
        for seq in self.engine.running:
            ticket = self.tickets.get(seq.request_id) if seq is not None else None
            if ticket is not None and ticket.stream:
                ids, _ = seq.settled(self.eos)
                if len(ids) > ticket.sent:
                    ticket.sent = len(ids)
                    ticket.put("text", ids)
