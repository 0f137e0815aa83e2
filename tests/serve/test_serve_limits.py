"""`dllm-rl serve`'s guards: the request body's size limit (413 before the body is read or the key checked) and the
API key's check (401 before the body is read)."""

from __future__ import annotations

import json
import socket
import time

import httpx
from serve_helpers import running

from dllm_rl.sampling import DecodeConfig

BASE = DecodeConfig(gen_length=16, threshold=0.5)


def _metric(client, name: str) -> float:
    line = next(ln for ln in client.get("/metrics").text.splitlines() if ln.startswith(f"dllm_rl_{name} "))
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
