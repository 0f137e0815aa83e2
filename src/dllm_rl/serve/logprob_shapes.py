"""The answers' log-probabilities in OpenAI's two shapes, from the engine's values at commit
(:class:`~dllm_rl.sampling.logprobs.TokenLogprobs`).

* completions (``"logprobs": K``): ``{tokens, token_logprobs, top_logprobs, text_offset}``, each
  ``top_logprobs`` entry a ``{token: logprob}`` of the K likeliest and the sampled token (so up to K + 1, as
  OpenAI); echoed prompt tokens have ``null`` for both (they were given, not committed by a step);
* chat (``"logprobs": true, "top_logprobs": K``): ``{content: [{token, logprob, bytes, top_logprobs}]}``.

A token's text is its own decoding (special tokens shown); ``bytes`` are that text's UTF-8 bytes, so a byte-level
BPE token holding part of a character reads as U+FFFD. ``text_offset`` is where the token starts in the choice's
text: the length of the decoded tokens before it (after the echoed prompt's text).
"""

from __future__ import annotations

from dllm_rl.sampling.logprobs import TokenLogprobs

WINDOW = 8  # tokens of context decoded with each token to measure how much text it adds


def starts(tokenizer, ids: list[int], base: int = 0) -> list[int]:
    """Where each of ``ids`` starts in their decoded text (skipping special tokens, as the answers do), plus
    ``base``: each token adds ``len(decode(window + token)) - len(decode(window))`` over the :data:`WINDOW` tokens
    before it (vLLM's incremental detokenisation does the same), so a 1,024-token answer costs 2,048 short decodes,
    not 1,024 of its prefixes (a tenth of a second on the asyncio thread at a Qwen vocabulary)."""
    out, at = [], base
    for k in range(len(ids)):
        out.append(at)
        window = ids[max(0, k - WINDOW) : k]
        at += len(tokenizer.decode(window + [ids[k]], skip_special_tokens=True)) - len(
            tokenizer.decode(window, skip_special_tokens=True))
    return out


def kept(tokenizer, ids: list[int], text: str) -> int:
    """How many of ``ids`` start inside ``text`` (an answer cut at a stop sequence keeps the token it cuts into)."""
    return sum(1 for s in starts(tokenizer, ids) if s < len(text)) if len(text) else 0


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_shape(tokenizer, lp: TokenLogprobs, count: int, prompt: list[int] | None = None,
                     prompt_text: str = "") -> dict:
    """The legacy ``logprobs`` object of a choice's first ``count`` answer tokens, after the echoed ``prompt``
    tokens (None: no echo) whose text is ``prompt_text``."""
    ids = lp.tokens[:count]
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    if prompt is not None:
        out["tokens"] += [_text(tokenizer, t) for t in prompt]
        out["token_logprobs"] += [None] * len(prompt)
        out["top_logprobs"] += [None] * len(prompt)
        out["text_offset"] += starts(tokenizer, prompt)
    out["tokens"] += [_text(tokenizer, t) for t in ids]
    out["token_logprobs"] += lp.logprobs[:count]
    for token, value, top in zip(ids, lp.logprobs, lp.top):
        out["top_logprobs"].append({_text(tokenizer, t): v for t, v in top} | {_text(tokenizer, token): value})
    out["text_offset"] += starts(tokenizer, ids, len(prompt_text))
    return out


def chat_shape(tokenizer, lp: TokenLogprobs, count: int, top: int) -> dict:
    """The chat ``logprobs`` object of a choice's first ``count`` answer tokens, ``top`` alternatives each."""

    def entry(token: int, value) -> dict:
        text = _text(tokenizer, token)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {"content": [entry(t, v) | {"top_logprobs": [entry(a, b) for a, b in alts[:top]]}
                        for t, v, alts in zip(lp.tokens[:count], lp.logprobs, lp.top)], "refusal": None}
