"""Which OpenAI request fields the server cannot honour: a request giving one of them outside its neutral values
is a 400 naming it, never silently dropped (``docs/serve.md`` has the whole field table).

The fields are those of the official ``openai`` SDK's ``CompletionCreateParams`` and chat
``CompletionCreateParams`` (plus vLLM's ``repetition_penalty``). ``None`` is always neutral (LangChain sends
``"logprobs": null`` and the like), as are the values the SDKs and LangChain send by default
(``presence_penalty: 0``, ``frequency_penalty: 0``, ...). A uniform-state family (DiffusionGemma) refuses the
masked-diffusion sampling fields on the same terms (:data:`UNIFORM_NEUTRAL`: ``temperature: 1``, ``top_p: 1``). A
field no SDK sends and the server does not know is a 400 too (the request schemas forbid extra fields), where vLLM
ignores it with a warning: a vLLM sampling extra (``min_p``, ``ignore_eos``, ...) would otherwise change nothing
without a word.
"""

from __future__ import annotations

from typing import Any

_UNSUPPORTED = "a diffusion model commits tokens out of order; this server's sampler has no such rule"

#: field -> (its neutral values besides None, why the server cannot honour another)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "presence_penalty": ((0,), f"penalties are not applied ({_UNSUPPORTED}); leave it out or 0"),
    "frequency_penalty": ((0,), f"penalties are not applied ({_UNSUPPORTED}); leave it out or 0"),
    "repetition_penalty": ((1,), f"penalties are not applied ({_UNSUPPORTED}); leave it out or 1"),
    "logit_bias": (({},), f"logit biases are not applied ({_UNSUPPORTED}); leave it out"),
    "suffix": (("",), "insertion after a suffix is not served; put the text in the prompt (a diffusion model can "
               "infill, but this endpoint does not)"),
    "tools": (([],), "tool calls are not parsed by this server; leave tools out"),
    "tool_choice": (("none",), "tool calls are not parsed by this server; leave tool_choice out"),
    "functions": (([],), "function calls are not parsed by this server; leave functions out"),
    "function_call": (("none",), "function calls are not parsed by this server; leave function_call out"),
    "response_format": (({"type": "text"},), "only text is served (no JSON mode or schema-constrained "
                        "decoding); leave it out or {\"type\": \"text\"}"),
    "audio": ((), "audio output is not served"),
    "modalities": ((["text"],), "only text output is served; leave it out or [\"text\"]"),
    "prediction": ((), "predicted outputs are not served"),
    "reasoning_effort": ((), "the served models have no reasoning-effort setting"),
    "verbosity": ((), "the served models have no verbosity setting"),
    "web_search_options": ((), "web search is not served"),
    "moderation": ((), "moderation is not run by this server"),
    "store": ((False,), "this server stores nothing; leave it out or false"),
    "service_tier": (("auto", "default"), "this server has one service tier; leave it out or \"auto\""),
}

#: the masked-diffusion sampling fields a uniform-state family (DiffusionGemma) refuses -> their neutral values
#: besides None: the SDKs' and LangChain's defaults, which leave its distribution as its own schedule makes it (the
#: t_max -> t_min temperatures, no nucleus cut)
UNIFORM_NEUTRAL: dict[str, tuple[Any, ...]] = {"temperature": (1,), "top_p": (1,)}

#: accepted and without effect on the answer (identifiers, caching hints, a tools qualifier without tools)
NO_EFFECT = ("user", "metadata", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
             "prompt_cache_options", "parallel_tool_calls")


def neutral(value: Any, values: tuple[Any, ...]) -> bool:
    """Whether a field given as ``value`` changes nothing: None, or one of its neutral ``values``."""
    return value is None or value in values


def refusal(values: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, message)`` of the first field in ``values`` (a request's fields, as given) the server cannot
    honour, or None."""
    for name, (accepted, why) in REFUSED.items():
        value = values.get(name)
        if not neutral(value, accepted):
            return name, f"{name}: {value!r} cannot be honoured: {why}"
    return None


def best_of_refusal(best_of: int | None, n: int) -> str | None:
    """``best_of`` other than None or ``n`` (n samples, the n best of them returned: all of them)."""
    if best_of is None or best_of == n:
        return None
    return (f"best_of: {best_of} asks for the best {n} of {best_of} samples ranked by likelihood, which this server "
            "does not rank (a diffusion model's answers have no left-to-right likelihood); leave it out or equal "
            "to n")
