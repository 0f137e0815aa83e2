"""`dllm-rl serve` over every published family's layout (tiny random models with a character tokenizer): a request
through the HTTP server gets what `generate` gives its prompt alone."""

from __future__ import annotations

import httpx
import pytest
import torch
from serve_helpers import alone_answer, running

from dllm_rl.models import build_model, char_tokenizer, get_family, tiny_config
from dllm_rl.sampling import DecodeConfig

TEXT_FAMILIES = ["llada", "dream", "sdar", "llada2", "llada_moe", "sdar_moe", "fast_dllm_v2"]
# full-attention families also with Fast-dLLM's caches (`dllm-rl serve --cache dual`); MDPO's RCR remasking
# (`--remasking rcr --steps 4`) on both kinds of attention
RCR = {"remasking": "rcr", "steps": 4, "threshold": None}
CASES = [(f, {}) for f in TEXT_FAMILIES] + [("llada", {"cache": "dual"}), ("dream", {"cache": "prefix"}),
                                            ("llada", RCR), ("sdar", RCR)]


def _char_model(family: str):
    """``(tokenizer, model)``: a tiny random ``family`` model (seed 1) on the character tokenizer, its head scaled
    so that some confidences pass a threshold."""
    tok = char_tokenizer()
    block = {"block_size": 4} if get_family(family).attention == "block" else {}
    cfg = tiny_config(family, vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **block)
    model = build_model(family, cfg, seed=1)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(20.0)
    return tok, model


@pytest.mark.parametrize(("family", "decoding"), CASES,
                         ids=[f"{f}-{'-'.join(map(str, d.values())) or 'none'}" for f, d in CASES])
def test_a_completion_of_every_family_equals_generate(family, decoding):
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok, model = _char_model(family)
    decode = DecodeConfig(**{"gen_length": 8, "block_length": 4, "threshold": 0.6, **decoding})
    ids = tok.encode("12+3=", add_special_tokens=False)
    with running(Server(model, tok, decode, ServeConfig(slots=2), family)) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0.7, "seed": 5})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
    alone = DecodeConfig(**{"gen_length": 8, "block_length": 4, "threshold": 0.6, "temperature": 0.7, "seed": 5,
                            **decoding})
    text, reason = alone_answer(model, tok, ids, alone, 8)
    assert (choice["text"], choice["finish_reason"]) == (text, reason) and text


def test_a_server_decoding_with_rcr_streams_only_tokens_no_later_step_takes_back():
    """RCR re-masks committed tokens of the block being decoded: the stream (and the stop check) reads only the
    finished blocks', so a streamed answer is the answer (seed 6 streamed a token RCR took back, and a stop
    sequence ended the request on it, when every committed token was read as final)."""
    import json

    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok, model = _char_model("llada")
    decode = DecodeConfig(gen_length=16, block_length=16, steps=16, remasking="rcr")
    ids = tok.encode("12+3=", add_special_tokens=False)
    with running(Server(model, tok, decode, ServeConfig(slots=2), "llada")) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        answers = {}
        for seed in (5, 6, 7):
            body = {"prompt": ids, "max_tokens": 16, "temperature": 0.9, "seed": seed}
            full = client.post("/v1/completions", json=body).json()["choices"][0]
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                events = [json.loads(line[6:]) for line in resp.iter_lines()
                          if line.startswith("data: ") and line[6:] != "[DONE]"]
            alone, reason = alone_answer(model, tok, ids, DecodeConfig(**{**vars(decode), "temperature": 0.9,
                                                                          "seed": seed}), 16)
            assert "".join(e["choices"][0]["text"] for e in events) == full["text"] == alone, seed
            assert full["finish_reason"] == reason
            answers[seed] = (alone, reason)
        stopped = client.post("/v1/completions", json={**body, "seed": 6, "stop": "V"}).json()["choices"][0]
        assert "V" not in answers[6][0] and (stopped["text"], stopped["finish_reason"]) == answers[6]
    plain = DecodeConfig(**{**vars(decode), "remasking": "low_confidence", "temperature": 0.9, "seed": 6})
    assert alone_answer(model, tok, ids, plain, 16)[0] != answers[6][0]  # RCR took tokens back here


def test_a_server_decoding_with_rcr_refuses_a_threshold_naming_why():
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok, model = _char_model("llada")
    decode = DecodeConfig(gen_length=8, block_length=8, steps=8, remasking="rcr")
    why = "this server decodes with RCR remasking (--remasking rcr), which re-masks on the static schedule"
    with running(Server(model, tok, decode, ServeConfig(slots=2), "llada")) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        refused = (({"threshold": 0.5}, "threshold", f"threshold: {why}: set steps, not threshold"),
                   ({"preset": "sdar"}, "preset", f"preset: 'sdar' decodes with a threshold; {why}"))
        for extra, param, message in refused:
            r = client.post("/v1/completions", json={"prompt": "1+2=", "max_tokens": 8, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param
            assert r.json()["error"]["message"] == message
        assert client.post("/v1/completions", json={"prompt": "1+2=", "max_tokens": 8, "steps": 4}).status_code == 200
