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
    """A running server over a tiny DiffusionGemma (2 slots, at most 8 denoising steps a canvas):
    ``(url, model, tokenizer)``."""
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
    limits = ServeConfig(slots=2, max_tokens=16, max_request_denoising_steps=8)
    with running(Server(model, tok, DECODE, limits, "gemma")) as url:
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


def _post(url: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60) as client:
        return client.post("/v1/completions", json=body)


@pytest.mark.parametrize(("extra", "whose"), [
    ({"max_denoising_steps": 10**9, "confidence_threshold": 0}, "1000000000"),
    ({"max_denoising_steps": 9}, "9"),
    ({"preset": "diffusion_gemma"}, "48 (preset 'diffusion_gemma''s)"),
])
def test_denoising_steps_above_the_servers_limit_are_a_400_naming_max_denoising_steps(served, extra, whose):
    """A request's steps per canvas (its own or its preset's) are bounded by --max-request-denoising-steps: without
    it, 10**9 steps under confidence_threshold 0 held a slot until --timeout-s."""
    r = _post(served[0], {"prompt": "1+2=", "max_tokens": 4, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_denoising_steps"
    assert r.json()["error"]["message"] == (f"max_denoising_steps: {whose} is above the server's "
                                            "--max-request-denoising-steps 8; ask for at most 8")


def test_denoising_steps_at_the_servers_limit_are_served(served):
    r = _post(served[0], {"prompt": "1+2=", "max_tokens": 4, "max_denoising_steps": 8, "confidence_threshold": 0})
    assert r.status_code == 200, r.text
    assert r.json()["nfe"] == 8  # one canvas, every step taken


def test_a_decode_default_above_the_step_limit_is_refused_at_construction():
    from dllm_rl.config import FieldError
    from dllm_rl.sampling.config import PresetDecodeConfig
    from dllm_rl.serve.config import ServeConfig

    with pytest.raises(FieldError, match=r"^decode\.max_denoising_steps: 500 is above max_request_denoising_steps "
                       r"\(192\), the most a request may decode with; lower it or raise max_request_denoising_steps$"):
        ServeConfig(decode=PresetDecodeConfig(max_denoising_steps=500))


def test_the_sdks_default_temperature_and_top_p_are_neutral(served):
    """temperature 1 and top_p 1 (what the OpenAI SDKs and LangChain send unless told) change nothing: the answer
    is the one without them, on both endpoints."""
    url, _, _ = served
    body = {"prompt": "12+3=", "max_tokens": 8, "seed": 5}
    plain, neutral = _post(url, body), _post(url, {**body, "temperature": 1, "top_p": 1.0})
    assert plain.status_code == neutral.status_code == 200, neutral.text
    assert neutral.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    with httpx.Client(base_url=url, timeout=60) as client:
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "7*6"}],
                                                         "max_tokens": 4, "temperature": 1, "top_p": 1})
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize(("extra", "param", "message"), [
    ({"temperature": 0.7}, "temperature", "leave temperature out (or give temperature 1: neutral)"),
    ({"top_p": 0.9, "temperature": 1}, "top_p", "leave top_p out (or give top_p 1: neutral)"),
    ({"top_k": 1}, "top_k", "leave top_k out"),
])
def test_other_temperatures_and_top_p_stay_a_400_naming_them(served, extra, param, message):
    r = _post(served[0], {"prompt": "1+2=", "max_tokens": 4, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert r.json()["error"]["message"].startswith(f"{param}: masked-diffusion options")
    assert r.json()["error"]["message"].endswith(message)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_prompt_over_the_context_names_the_field_the_client_sent(served, field):
    """The context's 400 names the budget as the client gave it (max_tokens 5, decoded as 8 slots: two canvases),
    never the sampler's gen_length."""
    r = _post(served[0], {"prompt": "1" * 1020, field: 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["message"] == (
        f"prompt: the prompt has 1020 tokens; with {field} 5 (decoded as 8 slots, whole blocks) it needs 1028 "
        f"positions but the model's context is 1024 (max_position_embeddings); shorten the prompt or {field}")
