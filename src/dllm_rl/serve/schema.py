"""The request bodies the server takes (pydantic models of OpenAI's completion and chat requests, as vLLM reads them)
and the error it answers in OpenAI's shape (:class:`ApiError`). A field the server does not know is refused by the
models themselves (``extra="forbid"``); which known fields are honoured, accepted without effect or refused is
:mod:`dllm_rl.serve.fields`, and the checks that need the model are :class:`dllm_rl.serve.app.Server`'s."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

# Every integer a request gives is a 64-bit one (a seed seeds a torch.Generator, steps and top_k reach torch): one
# outside is a 400 naming it here, not an overflow in the engine's thread
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None  # a last chunk with "choices": [] and the usage
    include_obfuscation: bool | None = None  # no obfuscation field is sent: true is refused


class Decoding(BaseModel):
    """The request fields both endpoints share. A field the server does not know is a 400 naming it; one it knows
    but cannot honour (:data:`~dllm_rl.serve.fields.REFUSED`) is a 400 unless neutral (None, or the SDKs'
    defaults)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None  # wins over max_tokens
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    threshold: float | None = None
    steps: Int64 | None = None
    seed: Int64 | None = None
    block_length: Int64 | None = None
    block_size: Int64 | None = None
    # uniform-state diffusion (DiffusionGemma) only: the stock sampler's knobs (vLLM's vllm_xargs), UNIFORM_OPTIONS
    max_denoising_steps: Int64 | None = None
    t_min: float | None = None
    t_max: float | None = None
    entropy_bound: float | None = None
    stability_threshold: Int64 | None = None
    confidence_threshold: float | None = None
    final_tokens: Literal["argmax", "sampled"] | None = None
    stream: bool | None = False
    stream_canvas: bool = False
    stream_options: StreamOptions | None = None
    n: Int64 | None = 1
    stop: str | list[str] | None = None
    preset: str | None = None
    # refused unless neutral (dllm_rl.serve.fields.REFUSED); NO_EFFECT ones are accepted and change nothing
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    user: Any = None


class CompletionRequest(Decoding):
    prompt: str | list[str] | list[Int64] | list[list[Int64]]
    logprobs: Int64 | None = None  # alternatives per token (0: the sampled token's own log-probability)
    echo: bool | None = False
    best_of: Int64 | None = None
    suffix: Any = None

    @field_validator("logprobs", mode="before")
    @classmethod
    def _no_logprobs(cls, value):  # "logprobs": false (the chat endpoint's shape) asks for none, not for 0
        return None if value is False else value


class Message(BaseModel):
    role: str
    content: str | list[Any] | None  # a string, or text and image_url parts (dllm_rl.serve.media)


class ChatRequest(Decoding):
    messages: list[Message]
    logprobs: bool | None = None
    top_logprobs: Int64 | None = None
    # refused unless neutral (dllm_rl.serve.fields.REFUSED)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    store: Any = None
    service_tier: Any = None
    # accepted without effect (dllm_rl.serve.fields.NO_EFFECT)
    metadata: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    parallel_tool_calls: Any = None


__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Decoding", "Int64", "Message", "StreamOptions"]
