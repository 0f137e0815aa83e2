"""`dllm-rl serve`'s guards: the request body's size limit (413 before the body is read or the key checked), the end
of the shutdown grace period (a JSON 503 and one log line per request still held), and the start-up refusals (an
empty API key, a port out of range or in use), each one line before the model loads."""

from __future__ import annotations

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import DEMO, Gate, running

from dllm_rl.cli import main
from dllm_rl.errors import UserError
from dllm_rl.sampling import DecodeConfig

BASE = DecodeConfig(gen_length=16, threshold=0.5)


def _metric(client, name: str, url: str = "") -> float:
    line = next(ln for ln in client.get(f"{url}/metrics").text.splitlines() if ln.startswith(f"dllm_rl_{name} "))
    return float(line.split()[1])


def _raw(url: str, head: str, pieces: list[bytes] = (), pause_s: float = 0.0) -> tuple[str, dict]:
    """Send ``head`` (the request line and headers) and then ``pieces`` over one socket; the status line and the
    JSON body of the answer, read until the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for piece in pieces:
            time.sleep(pause_s)
            sock.sendall(piece)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status, _, rest = data.decode().partition("\r\n")
    return status, json.loads(rest.partition("\r\n\r\n")[2])


def test_a_body_over_the_limit_is_413_and_a_missing_key_401_before_the_body_is_read(make_server):
    """A declared length over --max-request-bytes is answered at once (the 200 MB body is never sent), before the
    key is checked; a chunked body is refused at the piece that crosses the limit (its end never sent either); a
    body under it without the key is answered 401 before it is sent (FastAPI would parse it first); with the key it
    is served."""
    server = make_server(BASE, api_key="k3y", max_request_bytes=1000)
    refusal = {"message": "the request body is larger than the server's --max-request-bytes (1000 bytes)",
               "type": "invalid_request_error", "param": None, "code": "request_too_large"}
    with running(server) as url, httpx.Client(base_url=url, timeout=30) as client:
        head = "POST /v1/completions HTTP/1.1\nHost: x\nContent-Type: application/json\n"
        status, body = _raw(url, head + "Content-Length: 200000000\n")
        assert status.startswith("HTTP/1.1 413 ") and body == {"error": refusal}
        status, body = _raw(url, head + "Content-Length: 500\n")  # under the limit: the key, before the body
        assert status.startswith("HTTP/1.1 401 ") and body["error"]["code"] == "invalid_api_key"
        chunk = f"{600:x}\r\n".encode() + b" " * 600 + b"\r\n"  # 600 bytes, then 600 more: 1200 > 1000
        key = "Authorization: Bearer k3y\n"  # (without it the key's 401 would come before the limit is reached)
        assert _raw(url, head + key + "Transfer-Encoding: chunked\n", [chunk, chunk], pause_s=0.1)[1] == {
            "error": refusal}
        big = client.post("/v1/completions", json={"prompt": "1" * 1000})  # httpx: its Content-Length, 1015
        assert big.status_code == 413 and big.json() == {"error": refusal} and big.headers["connection"] == "close"
        streamed = client.post("/v1/completions", content=iter([b'{"prompt": "', b"1" * 1200, b'"}']),  # chunked
                               headers={"Authorization": "Bearer k3y"})
        assert streamed.status_code == 413 and streamed.json() == {"error": refusal}
        small = {"prompt": "1", "max_tokens": 4, "user": "u" * 900}  # (OpenAI's "user": ignored)
        assert client.post("/v1/completions", json=small).status_code == 401  # under the limit: the key is checked
        ok = client.post("/v1/completions", json=small, headers={"Authorization": "Bearer k3y"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert _metric(client, "requests_rejected_too_large_total") == 4
        assert _metric(client, "requests_rejected_unauthorized_total") == 2


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_requests_held_past_the_shutdown_timeout_get_a_503_and_one_log_line_each(make_server):
    server = make_server(BASE, slots=1, max_queue=2, shutdown_timeout_s=0.3)
    Gate(server)  # never opened: both requests are held until the grace period ends
    lines, uvicorn_log = _Lines(), logging.getLogger("uvicorn.error")
    with ThreadPoolExecutor(2) as pool, httpx.Client(timeout=30) as client:
        with running(server, graceful_s=None) as url:
            uvicorn_log.addHandler(lines)  # (uvicorn's configuration, made at the start, would have dropped it)
            plain = pool.submit(client.post, f"{url}/v1/completions", json={"prompt": "1"})

            def stream():
                with client.stream("POST", f"{url}/v1/completions", json={"prompt": "2", "stream": True}) as r:
                    return [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]

            streamed = pool.submit(stream)
            while _metric(client, "requests_total", url) < 2:
                time.sleep(0.01)
        uvicorn_log.removeHandler(lines)
    why = "the server shut down before the request finished (its --shutdown-timeout-s, 0.3 s, ran out)"
    r = plain.result()
    assert r.status_code == 503 and r.json() == {"error": {"message": why, "type": "server_error", "param": None,
                                                           "code": None}}
    assert streamed.result() == [{"error": {"message": why, "type": "server_error"}}]
    assert len(lines.lines) == 2 and all(ln.startswith("cmpl-") and ln.endswith(why) for ln in lines.lines), \
        lines.lines
    assert server.worker.counters.failed_shutdown == 2


# ---- start-up refusals: one line, status 2, before the model loads ---------------------------------------------

@pytest.fixture
def serve_cli(monkeypatch, capsys):
    """``serve_cli(*flags) -> (status, stderr)``: `dllm-rl serve DEMO FLAGS` in-process; loading the model fails
    the test (the refusals come first), and so does serving."""
    import dllm_rl.serve.cli as serve_cli_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(serve_cli_module, "build_server", no_model)
    monkeypatch.delenv("DLLM_RL_API_KEY", raising=False)

    def run(*flags: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            status = main(["serve", str(DEMO / "sdar-countdown"), *flags])
        except SystemExit as exit_:  # argparse's refusals
            status = exit_.code
        return status, capsys.readouterr().err

    return run


EMPTY = "the API key is empty; give another key, or {leave} to serve without one\n"


@pytest.mark.parametrize("flags, env, line", [
    (["--api-key", ""], None, "--api-key: " + EMPTY.format(leave="leave --api-key out")),
    (["--api-key", " \t"], None, "--api-key: " + EMPTY.format(leave="leave --api-key out")),
    ([], "", "$DLLM_RL_API_KEY: " + EMPTY.format(leave="unset DLLM_RL_API_KEY")),
    (["--api-key", "k3y\n"], None, "--api-key: the API key has whitespace at an end or a control character, which "
     "an HTTP header cannot carry; give another key, or leave --api-key out to serve without one\n"),
    (["--port", "99999"], None, "port: 99999 is not a TCP port (0 to 65535; 0: any free one)\n"),
    (["--port=-1"], None, "port: -1 is not a TCP port (0 to 65535; 0: any free one)\n"),
])
def test_a_bad_key_or_port_is_one_line_before_the_model_loads(serve_cli, monkeypatch, flags, env, line):
    if env is not None:
        monkeypatch.setenv("DLLM_RL_API_KEY", env)
    assert serve_cli(*flags) == (2, "dllm-rl serve: error: " + line)


def test_a_port_in_use_is_one_line_before_the_model_loads(serve_cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_cli("--port", str(port)) == (
            2, f"dllm-rl serve: error: --port {port}: 127.0.0.1:{port} is already in use; stop what listens there or "
            "choose another port (--port 0: any free one)\n")


def test_without_a_key_the_start_up_line_says_the_server_is_open(serve_cli, monkeypatch):
    """No key option at all: an open server, said so; --port 0 binds a free port, the one the line names and
    uvicorn is handed (it binds none itself)."""
    import dllm_rl.serve.cli as serve_cli_module
    import dllm_rl.serve.listen as listen

    handed = []
    fake = type("Fake", (), {"name": "sdar-countdown", "adapters": (), "api_key": None, "block": 4})()
    monkeypatch.setattr(serve_cli_module, "build_server", lambda *a, **k: fake)
    monkeypatch.setattr(listen, "GracefulServer", lambda server, log_level: type(
        "Uv", (), {"run": lambda self, sockets: handed.extend(s.getsockname()[1] for s in sockets)})())
    status, err = serve_cli("--port", "0")
    assert status == 0 and len(handed) == 1 and handed[0] > 0
    assert err == (f"serve: sdar-countdown on http://127.0.0.1:{handed[0]} (32 slots, decoding in blocks of 4; the "
                   "server is open (no API key; --api-key or $DLLM_RL_API_KEY sets one)); POST /v1/completions, "
                   "/v1/chat/completions\n")


@pytest.fixture
def started(serve_cli, monkeypatch):
    """``started(*argv) -> (build_server's arguments, uvicorn's log level, stderr)``: `dllm-rl serve ARGV` with the
    model and uvicorn faked (what the command line makes of its words and flags)."""
    import dllm_rl.serve.cli as serve_cli_module
    import dllm_rl.serve.listen as listen

    seen = {}
    fake = type("Fake", (), {"name": "m", "adapters": (), "api_key": None, "block": 4})()
    monkeypatch.setattr(serve_cli_module, "build_server", lambda *a: seen.setdefault("build", a) and fake)
    monkeypatch.setattr(listen, "GracefulServer", lambda server, log_level: seen.update(log_level=log_level) or type(
        "Uv", (), {"run": lambda self, sockets: None})())

    def run(*argv: str):
        status = main(["serve", *argv])
        return status, seen.get("build"), seen.get("log_level")

    return run


def test_serve_takes_a_yaml_overrides_and_flags(started, tmp_path):
    """`dllm-rl serve CONFIG.yaml key=value --key value`: the YAML, laid over with the overrides, then the flags."""
    from dllm_rl.serve.config import ServeConfig

    (tmp_path / "serve.yaml").write_text(f"model:\n  path: {DEMO / 'sdar-countdown'}\n  device: cpu\n  tokenizer: tok\n"
                                         "port: 0\nslots: 4\ndecode:\n  gen_length: 32\n  threshold: 0.5\n")
    status, build, log_level = started(str(tmp_path / "serve.yaml"), "decode.threshold=0.9", "max_queue=3",
                                       "--max-queue", "5", "--log-level", "info", "--served-model-name", "a", "b",
                                       "--lora", "x=adapter")
    assert status == 0 and log_level == "info"
    path, decode, cfg, device, dtype, loras, api_key, names, template, tokenizer = build
    assert (path, device, dtype, tokenizer) == (str(DEMO / "sdar-countdown"), "cpu", "auto", "tok")
    assert (decode.gen_length, decode.threshold, type(decode).__name__) == (32, 0.9, "DecodeConfig")
    assert isinstance(cfg, ServeConfig) and (cfg.slots, cfg.max_queue, cfg.port) == (4, 5, 0)
    assert (loras, api_key, names, template) == ({"x": "adapter"}, None, ["a", "b"], None)


def test_serve_old_flags_are_read_with_a_deprecation(started):
    from dllm_rl.config.renames import DeprecatedKey

    with pytest.warns(DeprecatedKey) as warned:
        status, build, _ = started(str(DEMO / "sdar-countdown"), "--port", "0", "--timeout", "5",
                                   "--shutdown-timeout", "1", "--gen-length", "32", "--preset", "sdar", "--seed", "3",
                                   "--device", "cpu", "--dtype", "bfloat16", "--early-stop", "--slots", "2")
    assert status == 0
    assert sorted(str(w.message).split("'")[1] + " -> " + str(w.message).split("'")[3] for w in warned) == [
        "device -> model.device", "dtype -> model.dtype", "gen_length -> decode.gen_length",
        "preset -> decode.preset", "seed -> decode.seed", "shutdown_timeout -> shutdown_timeout_s",
        "timeout -> timeout_s"]
    _, decode, cfg, device, dtype, *_ = build
    assert (device, dtype, cfg.timeout_s, cfg.shutdown_timeout_s, cfg.early_stop, cfg.slots) == (
        "cpu", "bfloat16", 5.0, 1.0, True, 2)
    assert (decode.gen_length, decode.threshold, decode.seed) == (32, 0.9, 3)  # sdar's threshold


def test_serve_without_a_model_is_one_line(started, capsys):
    assert started("--port", "0") == (2, None, None)
    assert capsys.readouterr().err == ("dllm-rl serve: error: give the model: dllm-rl serve MODEL_DIR (or "
                                       "model.path=DIR, or a config file that names it)\n")


def test_a_server_refuses_an_empty_api_key(make_server):
    with pytest.raises(UserError, match=r"^api_key: the API key is empty; give another key, or None to serve "):
        make_server(BASE, api_key="")
