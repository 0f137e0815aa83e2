"""Helpers for the serve tests and benchmarks/serve.py (imported by name; conftest.py holds only fixtures): a real
server, uvicorn on 127.0.0.1 (a free port) in a thread, and a gate that holds the engine."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "src" / "dllm_rl" / "assets" / "demo"
# A role-marking chat template (instead of the demo's own, the bare task prompt): "user: TEXT\nassistant: "
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def alone_answer(model, tokenizer, ids, config, max_tokens):
    """What `generate` gives this prompt alone, as the server words it: (text, finish_reason) of the answer (before
    its EOS) cut to ``max_tokens`` tokens."""
    from dllm_rl.sampling import generate

    roll = generate(model, [ids], config, seeds=[config.seed])
    answer = roll.completion_ids[0][roll.completion_mask[0]].tolist()
    ended = roll.finish_reason[0] == "eos"
    answer = answer[:-1] if ended else answer
    if len(answer) > max_tokens:
        answer, ended = answer[:max_tokens], False
    return tokenizer.decode(answer, skip_special_tokens=True), "stop" if ended else "length"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(server, graceful_s: float | None = 5.0):
    """Serve ``server`` (a :class:`dllm_rl.serve.app.Server`) as `dllm-rl serve` does, on a free port of 127.0.0.1,
    until the block ends; yields its base URL. ``graceful_s``: the grace period at the end (None: the server's
    ``--shutdown-timeout-s``)."""
    from dllm_rl.serve.listen import GracefulServer, bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    uv = GracefulServer(server, "warning", graceful_s)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


class Gate:
    """Until opened, the engine's steps only seat waiting requests in free slots and decode nothing: requests stay
    held (running or waiting) for as long as a test needs, while the worker still takes requests and aborts."""

    def __init__(self, server):
        self.open_event = threading.Event()
        engine = server.worker.engine
        real = engine.step

        def gated():
            if self.open_event.is_set():
                return real()
            engine._admit()
            time.sleep(0.005)
            return []

        engine.step = gated

    def open(self):
        self.open_event.set()
