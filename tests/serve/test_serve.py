"""`dllm-rl serve` over HTTP on 127.0.0.1: completions and chat, streaming and not, the same answers whoever is
served beside a request, 400 naming the field, 429 on a full queue, a departed client's slot freed, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_helpers import DEMO, Gate, alone_answer, free_port, running

from dllm_rl.sampling import DecodeConfig, generate

# the demo's held-out Countdown items in its compact prompt style
PROMPTS = [f"nums {' '.join(map(str, row['nums']))} target {row['target']}\n"
           for row in map(json.loads, (DEMO / "countdown_heldout.jsonl").read_text().splitlines()[:8])]
BASE = DecodeConfig(gen_length=32, threshold=0.5)


def _events(response) -> list:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def _metrics(client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {ln.split()[0].removeprefix("dllm_rl_"): float(ln.split()[1]) for ln in text.splitlines()
            if ln and not ln.startswith("#")}


def test_completions_and_chat_streaming_and_not(make_server, demo_model):
    model, tok = demo_model
    with running(make_server(BASE, slots=4)) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/health").json() == {"status": "ok", "model": "sdar-countdown"}
        r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 14}).json()
        text, reason = alone_answer(model, tok, tok.encode(PROMPTS[0], add_special_tokens=False), BASE, 14)
        assert r["choices"][0]["text"] == text and r["choices"][0]["finish_reason"] == reason
        assert r["object"] == "text_completion" and r["usage"]["prompt_tokens"] == 21
        assert r["usage"]["completion_tokens"] == len(tok.encode(text, add_special_tokens=False))
        # streaming: the deltas add up to the same text, sent in pieces as blocks settle, then the reason, [DONE]
        cfg = DecodeConfig(gen_length=32, threshold=0.5, temperature=0.9, seed=3)
        body = {"prompt": PROMPTS[2], "max_tokens": 32, "temperature": 0.9, "seed": 3, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = _events(resp)
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        pieces = [e["choices"][0]["text"] for e in events[:-2]]
        want, _ = alone_answer(model, tok, tok.encode(PROMPTS[2], add_special_tokens=False), cfg, 32)
        assert "".join(pieces) == want and len(pieces) >= 2 and all(pieces)
        # chat: the tokenizer's template, the same answer as generate on the templated prompt
        msgs = [{"role": "user", "content": PROMPTS[1]}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        chat_text, chat_reason = alone_answer(model, tok, ids, BASE, 32)
        c = client.post("/v1/chat/completions", json={"messages": msgs}).json()
        assert c["object"] == "chat.completion" and c["choices"][0]["message"] == {"role": "assistant",
                                                                                 "content": chat_text}
        assert c["choices"][0]["finish_reason"] == chat_reason and c["usage"]["prompt_tokens"] == len(ids)
        with client.stream("POST", "/v1/chat/completions", json={"messages": msgs, "stream": True}) as resp:
            events = _events(resp)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == chat_text
        assert events[-2]["choices"][0]["finish_reason"] == chat_reason
        m = _metrics(client)
        assert m["requests_total"] == 4 and m["requests_finished_total"] == 4 and m["slots"] == 4


def test_concurrent_clients_get_what_sequential_calls_get(make_server):
    bodies = [{"prompt": p, "max_tokens": 8 + 4 * (i % 3), "seed": i, "temperature": 0.8 * (i % 2),
               **({"threshold": 0.4} if i % 3 else {"steps": 2})} for i, p in enumerate(PROMPTS * 4)]
    with running(make_server(BASE, slots=32)) as url, httpx.Client(base_url=url, timeout=60) as client:
        one = [client.post("/v1/completions", json=b).json()["choices"][0] for b in bodies]
        steps_one = _metrics(client)["engine_steps_total"]
        with ThreadPoolExecutor(len(bodies)) as pool:
            many = list(pool.map(lambda b: client.post("/v1/completions", json=b).json()["choices"][0], bodies))
        steps_many = _metrics(client)["engine_steps_total"] - steps_one
    assert many == one and len({c["text"] for c in one}) > 5
    assert steps_many < steps_one / 2  # the 32 requests shared their steps


def test_stop_sequences_end_the_answer_and_free_the_slot_when_the_settled_text_reaches_one(make_server, demo_model):
    model, tok = demo_model
    ids = tok.encode(PROMPTS[0], add_special_tokens=False)
    full, _ = alone_answer(model, tok, ids, BASE, 32)
    assert full == "<answer>2*6-1</answer>"  # what the demo model answers this puzzle, greedy
    with running(make_server(BASE, slots=2)) as url, httpx.Client(base_url=url, timeout=60) as client:
        def ask(stop, stream=False):
            body = {"prompt": PROMPTS[0], "max_tokens": 32, "stop": stop, "stream": stream}
            if not stream:
                r = client.post("/v1/completions", json=body).json()
                return r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
            with client.stream("POST", "/v1/completions", json=body) as resp:
                events = _events(resp)
            pieces = [e["choices"][0]["text"] for e in events[:-1]]
            return pieces, events[-2]["choices"][0]["finish_reason"]

        steps0 = _metrics(client)["engine_steps_total"]
        assert ask("zz") == (full, "stop", len(tok.encode(full, add_special_tokens=False)))  # none in the answer
        steps_full = _metrics(client)["engine_steps_total"] - steps0
        # the earliest stop sequence held wins; the answer before it, its own token count
        assert ask(["</answer>", "-"]) == ("<answer>2*6", "stop", len(tok.encode("<answer>2*6",
                                                                                  add_special_tokens=False)))
        assert ask("*")[:2] == ("<answer>2", "stop")
        m = _metrics(client)
        # "*" and "-" were settled before the answer ended: those requests left their slots then, in fewer steps
        assert m["requests_stopped_total"] == 2 and m["requests_finished_total"] == 1
        assert m["engine_steps_total"] - steps0 - steps_full < 2 * steps_full
        # streaming: the text before the stop sequence, never a character of it, then "stop"
        pieces, reason = ask("</answer>", stream=True)
        assert "".join(pieces) == "<answer>2*6-1" and reason == "stop" and not any("<" in p for p in pieces[1:])
        pieces, reason = ask(["1</", "*"], stream=True)
        assert "".join(pieces) == "<answer>2" and reason == "stop"


def test_a_request_may_name_a_family_preset_under_its_own_options(make_server, demo_model):
    model, tok = demo_model
    ids = tok.encode(PROMPTS[2], add_special_tokens=False)
    server = make_server(DecodeConfig(gen_length=32, steps=2))  # the server's schedule: static, 2 steps per block
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        for body, cfg in [({"preset": "sdar"}, DecodeConfig(gen_length=32, threshold=0.9)),  # SDAR's threshold 0.9
                          ({"preset": "sdar", "threshold": 0.3, "temperature": 0.8, "seed": 2},
                           DecodeConfig(gen_length=32, threshold=0.3, temperature=0.8, seed=2)),
                          ({}, DecodeConfig(gen_length=32, steps=2))]:
            r = client.post("/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 32, **body}).json()
            want = alone_answer(model, tok, ids, cfg, 32)
            assert (r["choices"][0]["text"], r["choices"][0]["finish_reason"]) == want, body
            assert r["nfe"] == int(generate(model, [ids], cfg, seeds=[cfg.seed]).nfe[0]), body


def test_n_choices_decode_with_consecutive_seeds_as_alone(make_server, demo_model):
    model, tok = demo_model
    ids = tok.encode(PROMPTS[1], add_special_tokens=False)
    want = [alone_answer(model, tok, ids, DecodeConfig(gen_length=32, threshold=0.5, temperature=1.0, seed=7 + k), 32)
            for k in range(4)]
    assert len(set(want)) > 1  # sampled: the choices differ
    body = {"prompt": PROMPTS[1], "max_tokens": 32, "temperature": 1.0, "seed": 7, "n": 4}
    with running(make_server(BASE, slots=2, max_queue=2)) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json=body).json()  # 4 choices through 2 slots
        assert [(c["index"], c["text"], c["finish_reason"]) for c in r["choices"]] == [
            (k, *w) for k, w in enumerate(want)]
        assert r["usage"]["prompt_tokens"] == len(ids) and r["usage"]["completion_tokens"] > 0
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            events = _events(resp)
        assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
        chunks = [e["choices"][0] for e in events[:-1]]
        for k, (text, reason) in enumerate(want):  # each choice's deltas, by its index, then its finish reason
            mine = [c for c in chunks if c["index"] == k]
            assert "".join(c["text"] for c in mine) == text and mine[-1]["finish_reason"] == reason
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": 2,
                                                         "max_tokens": 8, "temperature": 1.0}).json()
        assert [c["index"] for c in chat["choices"]] == [0, 1]
        too_many = client.post("/v1/completions", json={**body, "n": 5})  # more than 2 slots + 2 waiting
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"


INVALID = [
    ({"prompt": "1", "temperature": -1}, "temperature", "temperature: must be >= 0, got -1.0"),
    ({"prompt": "1", "max_tokens": 65}, "max_tokens", "max_tokens: 65 is outside [1, 64]"),
    ({"prompt": "1", "block_size": 8}, "block_size", "block_size: 8 asked, but this server decodes with block_size"),
    ({"prompt": "1", "steps": 2, "threshold": 0.5}, "threshold", "threshold: set either steps (static schedule) or"),
    ({"prompt": "1", "preset": "fast"}, "preset", "preset: unknown decoding preset 'fast'; choose one of llada2, "),
    ({"prompt": "1", "n": 0}, "n", "n: 0 completions asked; give 1 to 288 (the server's --slots plus --max-queue)"),
    ({"prompt": "1", "stop": ["a", "b", "c", "d", "e"]}, "stop", "stop: give at most 4 non-empty stop sequences"),
    ({"prompt": "1", "stop": ""}, "stop", "stop: give at most 4 non-empty stop sequences, got ['']"),
    ({"prompt": [1, 500]}, "prompt", "prompt: the prompt has token ids outside the model's vocabulary [0, 91)"),
    ({"prompt": "1", "top_p": "high"}, "top_p", "top_p: Input should be a valid number"),
    # every integer field is a 64-bit one (a seed past it once overflowed in the engine's thread: a 503)
    ({"prompt": "1", "seed": 2**64}, "seed", "seed: Input should be less than or equal to 9223372036854775807"),
    ({"prompt": "1", "seed": -(2**63) - 1}, "seed",
     "seed: Input should be greater than or equal to -9223372036854775808"),
    ({"prompt": "1", "steps": 2**70}, "steps", "steps: Input should be less than or equal to 9223372036854775807"),
    ({"max_tokens": 4}, "prompt", "prompt: Field required"),
    ({"prompt": [1] * 40, "max_tokens": 16}, "prompt",  # --max-positions 48: 40 prompt tokens + 16 slots are 56
     "prompt: the prompt's 40 tokens and max_tokens 16 (decoded as 16 slots, whole blocks) need 56 positions, more "
     "than the server's --max-positions 48"),
    ({"prompt": "1", "preset": "fast_dllm_v2"}, "preset",  # sub-blocks of 8 in the demo model's blocks of 4
     "preset: 'fast_dllm_v2' does not fit this model: sub_block (8) must divide the model's block_size (4)"),
]


def test_an_invalid_request_gets_400_naming_the_field(make_server):
    with running(make_server(BASE, max_tokens=64, max_positions=48)) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        for body, param, message in INVALID:
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and message in err["message"], (body, err)
            assert err["type"] == "invalid_request_error"
        m = _metrics(client)
    assert m["requests_rejected_invalid_total"] == len(INVALID) and m["requests_total"] == 0


def test_integers_at_the_64_bit_bounds_are_served(make_server):
    """The request schema bounds its integers to 64 bits (past them: a 400 naming the field, INVALID above); the
    bounds themselves decode, seed + k of the last choices included."""
    with running(make_server(BASE)) as url, httpx.Client(base_url=url, timeout=60) as client:
        for body in ({"seed": 2**63 - 1, "n": 2}, {"seed": -(2**63)}, {"steps": 2**63 - 1, "top_k": 2**63 - 1}):
            r = client.post("/v1/completions", json={"prompt": "1", "max_tokens": 4, **body})
            assert r.status_code == 200, (body, r.text)


def test_chat_without_a_template_and_a_bad_message_are_400(make_server, demo_model):
    server = make_server(BASE)
    server.tokenizer = type("NoTemplate", (), {"chat_template": None})()
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert "no chat template; start the server with --chat-template FILE (a Jinja chat template), or use " \
            "/v1/completions" in r.json()["error"]["message"]
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user"}]})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.0.content: Field required")


def test_a_full_queue_gets_429_and_the_held_requests_finish(make_server):
    server = make_server(BASE, slots=1, max_queue=1)
    gate = Gate(server)
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        held = [pool.submit(client.post, "/v1/completions", json={"prompt": p}) for p in PROMPTS[:2]]
        while _metrics(client)["requests_total"] < 2:
            time.sleep(0.01)
        r = client.post("/v1/completions", json={"prompt": "1,2,3"})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        assert "the queue is full (1 running, 1 waiting)" in r.json()["error"]["message"]
        gate.open()
        assert [h.result().status_code for h in held] == [200, 200]
        assert client.post("/v1/completions", json={"prompt": "1,2,3"}).status_code == 200  # room again
        assert _metrics(client)["requests_rejected_queue_full_total"] == 1


@pytest.mark.parametrize("key", [None, "k3y"])  # (the key check must not hide a departed client)
def test_a_client_that_disconnects_frees_its_slot(make_server, key):
    server = make_server(BASE, api_key=key, slots=1, max_queue=4)
    gate = Gate(server)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with running(server) as url, httpx.Client(base_url=url, timeout=60, headers=headers) as client:
        # a streaming client that reads the first event and leaves; a plain one (3 choices) that gives up waiting
        with client.stream("POST", "/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "1"}], "stream": True}) as resp:
            lines = resp.iter_lines()  # kept: a dropped iterator closes the response (the client would leave)
            next(lines)
            held = time.monotonic() + 20
            while _metrics(client)["requests_running"] != 1:  # it holds the one slot (once the worker took it)
                assert time.monotonic() < held, str(_metrics(client))
                time.sleep(0.02)
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/completions", json={"prompt": "2", "n": 3}, timeout=0.3)
        deadline = time.monotonic() + 20
        while _metrics(client)["requests_aborted_disconnect_total"] < 4:
            assert time.monotonic() < deadline, _metrics(client)
            time.sleep(0.02)
        assert _metrics(client)["requests_running"] == 0  # the streaming one's slot and the 3 choices' freed
        assert _metrics(client)["requests_waiting"] == 0
        gate.open()
        while _metrics(client)["requests_running"] + _metrics(client)["requests_waiting"] > 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = client.post("/v1/completions", json={"prompt": "3"})
        m = _metrics(client)
    assert r.status_code == 200 and m["requests_finished_total"] == 1 and m["requests_aborted_disconnect_total"] == 4


def test_a_stopped_worker_fails_what_it_holds(make_server):
    """The server's shutdown (after uvicorn's grace period): every request still held is answered with an error."""
    import asyncio

    from dllm_rl.serve.worker import Ticket

    server = make_server(BASE, slots=1)
    gate = Gate(server)
    server.worker.start()
    loop = asyncio.new_event_loop()
    tickets = [Ticket([5, 6], BASE, 16, 0, False, asyncio.Queue(), loop) for _ in range(3)]
    for t in tickets:
        server.worker.submit(t)
    while len(server.worker.tickets) < 3:
        time.sleep(0.01)
    gate.open()
    server.worker.stop()
    loop.run_until_complete(asyncio.sleep(0))
    kinds = [t.events.get_nowait()[1] for t in tickets]  # (choice index, kind, value)
    assert "error" in kinds and set(kinds) <= {"done", "error"} and server.worker.tickets == {}
    assert server.worker.counters.failed_shutdown == kinds.count("error")
    loop.close()


@pytest.mark.parametrize("where, error", [
    # joining the batch: that request alone fails
    ("add_request", "the request could not join the batch: RuntimeError: the device failed"),
    # reading the watched requests' text after a step (a device read): what the engine holds fails, as in a step
    ("completions", "decoding failed: RuntimeError: the device failed"),
])
def test_an_error_fails_what_it_reaches_and_the_worker_serves_on(make_server, demo_model, monkeypatch, where, error):
    model, tok = demo_model
    server = make_server(BASE, slots=2)
    engine = server.worker.engine
    real, calls = getattr(engine, where), []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the device failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, where, flaky)
    body = {"prompt": PROMPTS[0], "max_tokens": 16, "stop": "zz"}  # (a stop sequence: its text is read each step)
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        bad = client.post("/v1/completions", json=body)
        good = client.post("/v1/completions", json=body)
    assert bad.status_code == 503 and bad.json()["error"]["message"] == error
    text, _ = alone_answer(model, tok, tok.encode(PROMPTS[0], add_special_tokens=False), BASE, 16)
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == text and len(calls) >= 2


def test_a_stream_never_sends_half_a_character(make_server, demo_model):
    """A byte-level BPE decodes a settled prefix that ends inside a character as U+FFFD; the stream holds that
    back, so the text it sent stays a prefix of the answer and the rest follows (here every prefix of odd length
    is made to end so)."""
    model, tok = demo_model

    class Bytes:
        def __getattr__(self, name):
            return getattr(tok, name)

        def decode(self, ids, **kw):
            return tok.decode(ids, **kw) + ("\ufffd" if len(ids) % 2 and len(ids) < 12 else "")

    server = make_server(BASE)
    server.tokenizer = Bytes()
    full, _ = alone_answer(model, tok, tok.encode(PROMPTS[0], add_special_tokens=False), BASE, 32)
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "stream": True}) as resp:
            events = _events(resp)
    pieces = [e["choices"][0]["text"] for e in events[:-2]]
    assert "".join(pieces) == full and not any("\ufffd" in p for p in pieces) and len(pieces) >= 2




def test_sigterm_finishes_the_held_requests_and_exits(tmp_path):
    """`dllm-rl serve` as a process (its API key from the environment): SIGTERM lets the held requests finish."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "OMP_NUM_THREADS": "1",
           "DLLM_RL_API_KEY": "k3y"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm_rl", "serve", str(DEMO / "sdar-countdown"), "--port",
                             str(port), "--slots", "2", "--gen-length", "32"], env=env, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer k3y"}) as client:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert httpx.get(f"{url}/v1/models").status_code == 401  # no key
            with ThreadPoolExecutor(4) as pool:
                held = [pool.submit(client.post, "/v1/completions", json={"prompt": p, "max_tokens": 32})
                        for p in PROMPTS[:4]]
                while float(next(ln for ln in client.get("/metrics").text.splitlines()
                                 if ln.startswith("dllm_rl_requests_total")).split()[1]) < 4:
                    time.sleep(0.01)
                proc.send_signal(signal.SIGTERM)
                codes = [h.result().status_code for h in held]
        # after its graceful shutdown uvicorn re-raises the signal, so the exit status says why the server stopped
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert codes == [200] * 4  # held requests finish within the grace period
    err = proc.stderr.read()
    assert "serve: sdar-countdown on http://127.0.0.1:" in err and "Traceback" not in err
    assert "/v1 requests need the API key" in err


def test_the_canvas_streams_after_every_step_for_viewers(make_server, demo_model):
    model, tok = demo_model
    cfg = DecodeConfig(gen_length=32, threshold=0.5, temperature=0.9, seed=5)
    ids = tok.encode(PROMPTS[3], add_special_tokens=False)
    alone = generate(model, [ids], cfg, seeds=[5])
    body = {"prompt": PROMPTS[3], "max_tokens": 30, "temperature": 0.9, "seed": 5, "stream": True,
            "stream_canvas": True}
    with running(make_server(BASE, slots=4)) as url, httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as resp:
            events = _events(resp)
        bad = client.post("/v1/completions", json={"prompt": "1", "stream_canvas": True})
    canvases = [e for e in events[:-1] if e.get("object") == "canvas"]
    deltas = [e for e in events[:-1] if e.get("object") != "canvas"]
    # one canvas per step, in order; the last step's is the answer as it ended (EOS fill included)
    assert [c["step"] for c in canvases] == list(range(1, int(alone.nfe[0]) + 1))
    # max_tokens 30 decodes 32 slots (blocks of 4); the canvas shows the 30 asked for
    assert canvases[-1]["tokens"] == alone.completion_ids[0].tolist()[:30]
    assert all(len(c["tokens"]) == 30 for c in canvases)
    mask = model.mask_token_id
    assert canvases[0]["tokens"].count(mask) > 0 and canvases[0]["text"] == tok.decode(canvases[0]["tokens"])
    for before, after in zip(canvases, canvases[1:]):  # a committed token never changes; masks only get fewer
        assert all(a == b for a, b in zip(before["tokens"], after["tokens"]) if a != mask)
        assert after["tokens"].count(mask) <= before["tokens"].count(mask)
    want, _ = alone_answer(model, tok, ids, cfg, 30)
    assert "".join(e["choices"][0]["text"] for e in deltas[:-1]) == want  # the text deltas are unchanged
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_canvas"


def test_an_api_key_guards_the_openai_routes(make_server, demo_model):
    """With an API key the /v1 routes answer 401 (OpenAI's error shape, counted) without it or with another, and
    serve with it; /health and /metrics stay open."""
    model, tok = demo_model
    server = make_server(BASE, api_key="s3cret")
    body = {"prompt": PROMPTS[0], "max_tokens": 4}
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        missing = client.post("/v1/completions", json=body)
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer other"})
        good = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        lower = client.get("/v1/models", headers={"Authorization": "bearer s3cret"})  # the scheme is case-blind
        health = client.get("/health")
        metrics = client.get("/metrics").text
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert missing.json()["error"]["message"].startswith("a valid API key is needed: send the header "
                                                         "'Authorization: Bearer <key>'")
    text, _ = alone_answer(model, tok, tok.encode(PROMPTS[0], add_special_tokens=False), BASE, 4)
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == text and lower.status_code == 200
    assert health.status_code == 200
    assert "dllm_rl_requests_rejected_unauthorized_total 2" in metrics
