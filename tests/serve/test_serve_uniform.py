"""`dllm-rl serve` on a uniform-state family (DiffusionGemma, a tiny random checkpoint on the character tokenizer):
completions, chat and streams get what `generate` gives the prompt alone under the request's own sampler knobs;
masked-diffusion request fields are one 400 naming them; log-probabilities come from the step that kept each token."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from serve_helpers import CHAT_TEMPLATE, alone_answer, running

from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.sampling import DecodeConfig

CANVAS = 4
DECODE = DecodeConfig(gen_length=2 * CANVAS, max_denoising_steps=4, seed=3)


@pytest.fixture(scope="module")
def served():
    """A running server over a tiny DiffusionGemma (2 slots): ``(url, model, tokenizer)``."""
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok = char_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    cfg = tiny_config("diffusion_gemma", vocab_size=len(tok) + 3, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = build_model("diffusion_gemma", cfg, seed=1)
    with torch.no_grad():  # sharper logits: EOS comes, rows stop early
        model.hf_model.model.decoder.embed_tokens.weight.mul_(8.0)
    with running(Server(model, tok, DECODE, ServeConfig(slots=2, max_tokens=16), "gemma")) as url:
        yield url, model, tok


KNOBS = {"max_denoising_steps": 3, "t_max": 0.9, "confidence_threshold": 0.05}


@pytest.mark.parametrize("knobs", [{}, KNOBS], ids=["server-knobs", "request-knobs"])
def test_completions_and_streams_equal_generate_alone(served, knobs):
    url, model, tok = served
    ids = tok.encode("12+3=", add_special_tokens=False)
    body = {"prompt": ids, "max_tokens": 8, "seed": 5, **knobs}
    with httpx.Client(base_url=url, timeout=60) as client:
        full = client.post("/v1/completions", json=body)
        assert full.status_code == 200, full.text
        choice = full.json()["choices"][0]
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines()
                      if line.startswith("data: ") and line[6:] != "[DONE]"]
    text, reason = alone_answer(model, tok, ids, DecodeConfig(**{**vars(DECODE), "seed": 5, **knobs}), 8)
    assert (choice["text"], choice["finish_reason"]) == (text, reason) and text
    assert "".join(e["choices"][0]["text"] for e in events) == text
    assert events[-1]["choices"][0]["finish_reason"] == reason


def test_chat_equals_generate_on_the_templated_prompt(served):
    url, model, tok = served
    messages = [{"role": "user", "content": "7*6"}]
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "seed": 2,
                                                      "max_denoising_steps": 2})
    assert r.status_code == 200, r.text
    prompt = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                        add_special_tokens=False)
    text, reason = alone_answer(model, tok, prompt, DecodeConfig(**{**vars(DECODE), "seed": 2,
                                                                    "max_denoising_steps": 2}), 8)
    choice = r.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (text, reason)


@pytest.mark.parametrize(("extra", "param", "fragment"), [
    ({"temperature": 0.7, "steps": 4}, "temperature", "temperature, steps: masked-diffusion options; diffusion_gemma "
     "is uniform-state diffusion (no mask token), whose requests take max_denoising_steps, t_min, t_max, "
     "entropy_bound, stability_threshold, confidence_threshold, final_tokens, seed; leave temperature, steps out"),
    ({"block_length": 4}, "block_length", "block_length: masked-diffusion options"),
    ({"t_min": 0.9}, "t_max", "t_max: must be above t_min (0.9)"),
    ({"preset": "sdar"}, "preset", "preset: 'sdar' does not fit this model: threshold=0.9 is a masked-diffusion"),
])
def test_masked_request_fields_are_one_400_naming_them(served, extra, param, fragment):
    url, _, _ = served
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "1+2=", "max_tokens": 4, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert r.json()["error"]["message"].startswith(fragment)


def test_logprobs_are_those_of_the_kept_tokens(served):
    """Each answer token's log-probability (under the tempered distribution of its canvas's last step, whose argmax
    it is) and the alternatives, the token itself first."""
    url, _, _ = served
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "12+3=", "max_tokens": 8, "seed": 5, "logprobs": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] and len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"])
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert math.isfinite(value) and value <= 0 and len(top) == 2
        assert next(iter(top)) == token and top[token] == pytest.approx(value)


def test_a_masked_family_refuses_the_uniform_knobs():
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    decode = DecodeConfig(gen_length=4, block_length=4, steps=4)
    with running(Server(build_model("llada", cfg, seed=0), tok, decode, ServeConfig(slots=1), "llada")) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "1", "max_tokens": 4, "max_denoising_steps": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_denoising_steps"
    assert r.json()["error"]["message"] == ("max_denoising_steps: uniform-state diffusion options (DiffusionGemma); "
                                            "llada is masked diffusion; leave max_denoising_steps out")
