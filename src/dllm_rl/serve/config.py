"""`ServeConfig`: the whole of ``dllm-rl serve`` (model, request defaults of the decoding, address, key, adapters)
over :class:`ServeLimits`, the limits the running server reads, checked at construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from dllm_rl.config import Checked, FieldError, field
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.sampling.config import DECODE_RENAMED, MODEL_RENAMED, PresetDecodeConfig

API_KEY_ENV = "DLLM_RL_API_KEY"  # the api_key default (keeps the key out of the process list)
#: uvicorn's log levels
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _port_problem(port: int) -> str | None:
    return None if 0 <= port <= 65535 else f"{port} is not a TCP port (0 to 65535; 0: any free one)"


@dataclass
class ServeLimits(Checked):
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
    max_request_denoising_steps: int = field(
        192, ge=1, help="Uniform-state models (DiffusionGemma): the most denoising steps per canvas a request may "
        "decode with (its max_denoising_steps, its preset's, or the server's decode default); more is answered 400 "
        "naming max_denoising_steps. Each step is a forward pass, and confidence_threshold 0 takes every one: "
        "without a bound one request holds a slot until --timeout-s. 192: four times the stock 48.")
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
        "fewer forward passes; a request whose decode has stop_on_eos false decodes its whole length).")


@dataclass
class ServeConfig(ServeLimits):
    """``dllm-rl serve [MODEL_DIR | CONFIG.yaml] [key=value ...] [--key value ...]``: the server's limits (slots to
    early_stop: :class:`ServeLimits`, what the running server reads), the ``model:`` served, the ``decode:`` defaults
    of every request (each may set temperature, top_p, top_k, threshold, steps, seed and max_tokens), where it
    listens and who may ask."""

    #: the flags of earlier releases (``--gen-length``, ``--device``, ``--timeout`` ...) -> their keys now
    RENAMED: ClassVar[dict[str, str]] = {**MODEL_RENAMED, **DECODE_RENAMED, "timeout": "timeout_s",
                                         "shutdown_timeout": "shutdown_timeout_s"}

    model: ModelSection = field(default_factory=ModelSection, help="the checkpoint served")
    decode: PresetDecodeConfig = field(default_factory=PresetDecodeConfig,
                                       help="the decoding of a request that sets none (seed: a request's answer "
                                       "never depends on the others served beside it)")
    host: str = field("127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    port: int = field(8000, check=_port_problem, help="port, 0 to 65535 (0: any free port, named by the start-up "
                      "line); one in use is refused before the model loads")
    log_level: str = field("warning", choices=LOG_LEVELS, help="uvicorn's log level")
    api_key: str | None = field(
        None, help="require \"Authorization: Bearer KEY\" on the /v1 routes (401 without it; /health, /metrics and "
        f"/docs stay open); None: ${API_KEY_ENV} if set, else none (an open server); an empty key is refused")
    lora: list[str] = field(
        default_factory=list, help="NAME=DIR: serve a LoRA adapter folder (peft's adapter_config.json + weights, e.g. "
        "a run's checkpoints/step-N/adapter) as model NAME: a request whose \"model\" is NAME decodes with it, "
        "others with the base model (a repeatable flag; every adapter shares the slots)")
    # a flag of several values at once (``--served-model-name a b``, as vLLM's): dllm_rl.config.command's "several"
    served_model_name: list[str] = dataclasses.field(default_factory=list, metadata={"several": True, "help": (
        "the names the base model is served as (a request's \"model\" may give any; responses and /v1/models "
        "report the first); empty: the checkpoint folder's name (a run's final/ is served as \"final\")")})
    chat_template: str | None = field(
        None, help="a Jinja chat template file for /v1/chat/completions (for a model whose tokenizer has none, or to "
        "replace its own); without one, a model with no template answers chat requests 400")

    def __post_init__(self) -> None:
        super().__post_init__()
        steps, limit = self.decode.max_denoising_steps, self.max_request_denoising_steps
        if steps is not None and steps > limit:  # every request left at the default would be refused
            raise FieldError("decode.max_denoising_steps", f"{steps} is above max_request_denoising_steps ({limit}), "
                             "the most a request may decode with; lower it or raise max_request_denoising_steps")
