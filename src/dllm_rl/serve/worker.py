"""The engine's thread: the only one that touches the model. It takes requests and aborts from a thread-safe
queue, steps the engine while anything is held, and hands each request's events to its asyncio queue.

A request names its LoRA adapter (``Ticket.adapter``: one loaded by ``dllm-rl serve --lora NAME=DIR``; None: the
base model); requests with different adapters share the engine's steps (its mixed-adapter batch), so a request
decodes with its adapter as it would alone, whichever adapters the other requests use.

Events a request receives, in order: ``("text", ids)`` whenever its answer's settled prefix grew (streaming
requests: the committed tokens before the first masked slot, :func:`~dllm_rl.sampling.sequence.settled`); with
``canvas``, also ``("canvas", (step, ids))`` after each of its steps (the whole completion, mask ids where still
masked); then one of ``("done", rollout)``, ``("error", message)`` or, for a request with stop sequences whose
settled text (decoded, cut to ``max_tokens``) came to hold one, ``("stopped", text)`` (the text before it), its
slot freed in the same step. A request asking for ``logprobs`` finds its tokens' log-probabilities at commit in
``Ticket.logprobs_at_end`` when its final event arrives. After each step the thread reads every watched request's
completion from the device at once (:meth:`Engine.completions`). A request's decoding depends on itself alone (the
engine's batch invariance), so concurrent requests get what they would get one at a time.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.engine import BASE_MODEL, Engine
from dllm_rl.sampling.logprobs import TokenLogprobs
from dllm_rl.sampling.sequence import settled

IDLE_WAIT_S = 0.05  # how long the idle thread blocks on its inbox before checking whether to stop


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` before the earliest stop sequence it holds, and whether it held one."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


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
    adapter: str | None = None  # the LoRA adapter it decodes with (None: the base model)
    canvas: bool = False  # stream the whole canvas after each step (viewers)
    stop: tuple[str, ...] = ()  # stop sequences: its settled text is checked as it grows
    max_tokens: int | None = None  # the answer's tokens shown (the engine decodes them rounded up to the block)
    index: int = 0  # its choice in the request (n > 1: the request's tickets share ``events``)
    logprobs: int | None = None  # record its tokens' log-probabilities at commit, with this many alternatives
    logprobs_at_end: TokenLogprobs | None = None  # those values, set before its final event is put
    images: PromptImages | None = None  # LLaDA-V: the prompt's image features (shared by the request's tickets)
    request_id: int | None = None
    sent: int = 0  # settled tokens already sent (streaming)
    steps_sent: int = 0  # steps whose canvas was sent (canvas streaming)
    steps: int = 0  # its steps so far (watched requests: streams, canvases, stop sequences)
    arrived: float = field(default_factory=time.monotonic)

    def put(self, kind: str, value) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, value))


@dataclass
class Counters:
    """What ``/metrics`` reports (written by the worker and the app; ints, so reads need no lock)."""

    requests: int = 0
    finished: int = 0
    rejected_queue_full: int = 0
    rejected_invalid: int = 0
    rejected_too_large: int = 0
    rejected_unauthorized: int = 0
    aborted_disconnect: int = 0
    timed_out: int = 0
    stopped: int = 0
    failed_shutdown: int = 0
    steps: int = 0
    tokens: int = 0


class Worker:
    """Runs ``engine`` on a thread (see the module docstring); :meth:`submit` and :meth:`abort` are thread-safe."""

    def __init__(self, engine: Engine, eos: int | tuple[int, ...], decode: Callable[[list[int]], str] = lambda ids: ""):
        self.engine, self.eos, self.decode = engine, eos, decode
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.tickets: dict[int, Ticket] = {}  # the engine's request id -> ticket
        self.counters = Counters()
        # held by the thread while it steps: another thread that runs the model (a request's image encoding) takes it
        self.model_lock = threading.Lock()
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
        """Stop the thread; every request still held gets ``("error", reason)``. Called again (the end of the grace
        period, then the application's shutdown), it fails nothing twice."""
        self._stop.set()
        self._thread.join()
        held, self.tickets = list(self.tickets.values()), {}
        while True:  # and those submitted but not taken yet
            try:
                kind, value = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                held.append(value)
        for ticket in held:
            self.counters.failed_shutdown += 1
            ticket.put("error", reason)

    @property
    def running(self) -> int:
        return sum(s is not None for s in self.engine.running)

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    # ---- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            busy = self.engine.has_unfinished()
            self._drain(block=not busy)
            if busy:
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
        # the base model's requests turn the adapters off where the model has some
        adapter = ticket.adapter if ticket.adapter is not None else BASE_MODEL if self.engine.adapters() else None
        try:
            ticket.request_id = self.engine.add_request(ticket.prompt, seed=ticket.seed, gen_length=ticket.gen_length,
                                                        config=ticket.config, adapter=adapter,
                                                        logprobs=ticket.logprobs, images=ticket.images)
        except ValueError as err:  # UserError / FieldError: checked by the app before, so rare
            ticket.put("error", str(err))
            return
        except Exception as err:  # a bug or a device error in one request fails that request, not the thread
            ticket.put("error", f"the request could not join the batch: {type(err).__name__}: {err}")
            return
        self.tickets[ticket.request_id] = ticket

    def _abort(self, ticket: Ticket, why: str) -> None:
        if ticket.request_id is not None and self.tickets.pop(ticket.request_id, None) is not None:
            self.engine.abort(ticket.request_id)
            setattr(self.counters, why, getattr(self.counters, why) + 1)

    def _step(self) -> None:
        engine = self.engine
        try:
            with self.model_lock:
                finished = engine.step()
            self.counters.steps += 1
            self._answer(finished)
        except Exception as err:  # a bug or a device error: fail what is held rather than hang it
            for ticket in self.tickets.values():
                ticket.put("error", f"decoding failed: {type(err).__name__}: {err}")
            self.tickets.clear()
            for seq in engine.running:
                if seq is not None:
                    engine.abort(seq.request_id)
            engine.waiting.clear()

    def _answer(self, finished) -> None:
        """After a step: the finished requests' answers, then the watched ones' canvases, settled text and stops."""
        engine = self.engine
        for done in finished:
            ticket = self.tickets.pop(done.request_id, None)
            if ticket is not None and ticket.canvas:  # the final canvas: the answer as it ended
                ticket.put("canvas", (int(done.rollout.nfe[0]), done.rollout.completion_ids[0].tolist()))
            if ticket is not None:
                self.counters.finished += 1
                self.counters.tokens += int(done.rollout.completion_mask.sum())
                ticket.logprobs_at_end = done.logprobs
                ticket.put("done", done.rollout)
        watched = {seq.request_id: (seq, ticket) for seq in engine.running if seq is not None
                   and (ticket := self.tickets.get(seq.request_id)) is not None
                   and (ticket.stream or ticket.canvas or ticket.stop)}
        progress = engine.completions(list(watched)) if watched else {}  # one device read for all of them
        for seq, ticket in watched.values():
            tokens, todo = progress[seq.request_id]
            ticket.steps = seq.nfe
            if ticket.canvas and seq.nfe > ticket.steps_sent:
                ticket.steps_sent = seq.nfe
                ticket.put("canvas", (seq.nfe, tokens))
            if ticket.stream or ticket.stop:
                ids, _ = settled(tokens, todo, self.eos, seq.final_slots())
                if len(ids) <= ticket.sent:
                    continue
                ticket.sent = len(ids)
                text, stopped = cut_at_stop(self.decode(ids[: ticket.max_tokens]), ticket.stop) if ticket.stop \
                    else ("", False)
                if stopped:  # the answer is final up to the stop sequence: its slot goes at once
                    ticket.logprobs_at_end = seq.token_logprobs()
                    del self.tickets[seq.request_id]
                    engine.abort(seq.request_id)
                    self.counters.stopped += 1
                    ticket.put("stopped", text)
                elif ticket.stream:
                    ticket.put("text", ids)
