"""`ServeConfig`: the server's limits, checked at construction (the decoding itself is a DecodeConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_rl.config import Checked, field


@dataclass
class ServeConfig(Checked):
    """Limits of ``dllm-rl serve``: how many requests decode at once, wait, and for how long."""

    slots: int = field(32, ge=1, help="Requests decoded at once (the engine's slots); the rest wait in the queue.")
    max_queue: int = field(
        256, ge=0, help="Requests that may wait for a slot; one more is answered 429 (retry later).")
    max_request_bytes: int = field(
        16 * 1024 * 1024, ge=1, help="The largest request body, in bytes; a larger one is answered 413 before it is "
        "read (its Content-Length, or the bytes of a chunked body as they arrive) and before the API key is checked. "
        "16 MiB is far more than text needs and leaves room for images sent as data URIs.")
    max_tokens: int = field(
        1024, ge=1, help="The largest max_tokens a request may ask for; more is answered 400 naming max_tokens.")
    max_positions: int | None = field(
        None, ge=1, help="The positions a request may take, prompt plus completion slots; more is answered 400 "
        "naming the prompt. It bounds the engine's memory (EngineConfig.max_positions): a block model's KV cache "
        "is slots x max_positions positions, allocated at the first step (a position: layers x 2 x KV "
        "heads x head dim x bytes, 144 KiB for an 8B Qwen3-shaped model in bfloat16), as is a full-attention "
        "model's under --cache dual / prefix; without a cache a full-attention model pads every step's rows to the "
        "longest running. None: the model's context (the cache then grows to the "
        "longest request admitted).")
    timeout_s: float = field(
        600.0, gt=0, help="Seconds a request may take from arrival to its last token; then its slot is freed and "
        "it is answered 504 (or, streaming, an error event).")
    shutdown_timeout_s: float = field(
        30.0, ge=0, help="On SIGTERM: seconds the requests held may take to finish; those still running then "
        "fail (never hang).")
    allowed_local_media_path: str | None = field(
        None, help="A folder whose image files chat requests may name (an image_url that is a file: URL or a path; "
        "symlinks resolved, a path outside it refused), as vLLM's option of this name; None: only data URIs are "
        "read. http(s) image URLs are always refused (the server fetches nothing).")
    early_stop: bool = field(
        False, help="Stop a request as soon as its answer is decided (EngineConfig.early_stop: the same answer, "
        "fewer forward passes).")
