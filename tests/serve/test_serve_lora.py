"""`dllm-rl serve --lora NAME=DIR`: LoRA adapters served by name beside the base model, each request decoding with
the adapter its "model" names exactly as it would alone, whichever adapters the requests beside it use."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from serve_helpers import DEMO, alone_answer, running

from dllm_rl.errors import UserError
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.sampling import DecodeConfig
from dllm_rl.training.lora import LoraOptions, apply_lora, load_named_adapters, save_adapter

PROMPTS = [f"nums {' '.join(map(str, row['nums']))} target {row['target']}\n"
           for row in map(json.loads, (DEMO / "countdown_heldout.jsonl").read_text().splitlines()[:3])]
BASE = DecodeConfig(gen_length=16, threshold=0.5)


def _demo(name: str = "sdar-countdown"):
    return load_model(DEMO / name)


def _write_adapters(root, demo: str):
    for i, name in enumerate(("plus", "minus")):
        model = apply_lora(_demo(demo), LoraOptions(enabled=True, r=4), seed=i)
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for pname, p in model.model.named_parameters():
                if "lora_B" in pname:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        save_adapter(model, root / name)
    return root


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two saved adapters on the demo block model whose B matrices are random (a fresh adapter changes nothing)."""
    return _write_adapters(tmp_path_factory.mktemp("loras"), "sdar-countdown")


@pytest.mark.parametrize("demo", ["sdar-countdown", "llada-countdown"])
def test_the_engine_decodes_every_adapter_in_the_same_steps_as_alone(demo, adapters, tmp_path):
    """Requests for two adapters and the base model, interleaved, sampled with threshold decoding on a block and a
    full-attention model: each gets the tokens and step map ``generate`` gives it on a model holding only its
    adapter (or none), and the steps' forwards mix the three."""
    from dllm_rl.sampling import generate
    from dllm_rl.sampling.engine import BASE_MODEL, Engine, EngineConfig

    root = adapters if demo == "sdar-countdown" else _write_adapters(tmp_path, demo)
    tok = load_tokenizer(DEMO / demo)
    config = DecodeConfig(gen_length=16, block_length=16 if demo == "llada-countdown" else None, threshold=0.5,
                          temperature=1.0)
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    names = [(i, name) for i in range(len(ids)) for name in (BASE_MODEL, "plus", "minus")]
    engine = Engine(load_named_adapters(_demo(demo), {"plus": root / "plus", "minus": root / "minus"}), config,
                    EngineConfig(slots=4))
    forwards = []
    real = engine.model.forward
    engine.model.forward = lambda *a, **k: forwards.append(k.get("adapter_names")) or real(*a, **k)
    rids = {engine.add_request(ids[i], seed=7 + k, adapter=name): (i, name, 7 + k) for k, (i, name) in enumerate(names)}
    got = {}
    while engine.has_unfinished():
        got.update({c.request_id: c.rollout for c in engine.step()})
    assert any(f and len(set(f)) == 3 for f in forwards)  # one forward held the base model's and both adapters' rows
    assert any(f is None for f in forwards)  # the last rows, of one adapter, ran it directly (no mixed batch)
    by = {rids[r][:2]: got[r].completion_ids for r in got}
    assert any(not torch.equal(by[(i, BASE_MODEL)], by[(i, name)]) for i in range(len(ids)) for name in ("plus",
               "minus"))  # the adapters change answers
    alone = {None: _demo(demo)}
    for name in ("plus", "minus"):
        alone[name] = load_named_adapters(_demo(demo), {name: root / name})
    for rid, (i, name, seed) in rids.items():
        want = generate(alone[None if name == BASE_MODEL else name], [ids[i]], config, seeds=[seed])
        assert torch.equal(got[rid].completion_ids, want.completion_ids), (i, name)
        assert torch.equal(got[rid].step_map, want.step_map), (i, name)
    with pytest.raises(UserError, match="adapter: request 9: the model has no LoRA adapter 'other'; loaded: plus, "
                       "minus"):
        engine.add_request(ids[0], adapter="other")


def test_requests_decode_with_the_adapter_they_name_as_alone(adapters):
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok = load_tokenizer(DEMO / "sdar-countdown")
    served = load_named_adapters(_demo(), {"plus": adapters / "plus", "minus": adapters / "minus"})
    want = {}
    for name in (None, "plus", "minus"):  # each on a model holding only that adapter (or none)
        model = _demo() if name is None else load_named_adapters(_demo(), {name: adapters / name})
        for p in PROMPTS:
            want[(name, p)] = alone_answer(model, tok, tok.encode(p, add_special_tokens=False), BASE, 16)[0]
    assert want[("plus", PROMPTS[0])] != want[(None, PROMPTS[0])] or want[("minus", PROMPTS[1])] != \
        want[(None, PROMPTS[1])]  # the adapters change answers
    server = Server(served, tok, BASE, ServeConfig(slots=4, max_tokens=16), "sdar-countdown", ("plus", "minus"))
    bodies = [{"prompt": p, "max_tokens": 16, **({"model": name} if name else {})}
              for p in PROMPTS for name in (None, "plus", "minus", "sdar-countdown")]
    with running(server) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["sdar-countdown", "plus", "minus"]
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: client.post("/v1/completions", json=b).json(), bodies))
        bad = client.post("/v1/completions", json={"prompt": "1", "model": "other"})
    for body, answer in zip(bodies, answers):
        name = None if body.get("model") in (None, "sdar-countdown") else body["model"]
        assert answer["choices"][0]["text"] == want[(name, body["prompt"])], body
        assert answer["model"] == (name or "sdar-countdown")
    assert bad.status_code == 404  # OpenAI's and vLLM's answer (the SDK's NotFoundError)
    assert bad.json()["error"] == {"message": "The model `other` does not exist; served: sdar-countdown, plus, minus",
                                   "type": "NotFoundError", "param": "model", "code": "model_not_found"}


def test_a_request_naming_an_adapter_leaves_the_model_as_it_was(adapters):
    """A training model's own adapter stays active and trainable after the engine decodes a request with another:
    a later request naming none decodes with the model's adapter, as generate does."""
    from dllm_rl.sampling import generate
    from dllm_rl.sampling.engine import Engine, EngineConfig

    model = apply_lora(_demo(), LoraOptions(enabled=True, r=4), seed=3)  # "default", trainable
    with torch.no_grad():
        for pname, p in model.model.named_parameters():
            if "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) * 0.5)
    model.model.load_adapter(str(adapters / "plus"), adapter_name="plus", is_trainable=False)
    trainable = sorted(n for n, p in model.model.named_parameters() if p.requires_grad)
    config = DecodeConfig(gen_length=16, threshold=0.5)
    ids = load_tokenizer(DEMO / "sdar-countdown").encode(PROMPTS[0], add_special_tokens=False)
    want = generate(model, [ids], config, seeds=[1]).completion_ids
    engine = Engine(model, config, EngineConfig(slots=2))
    first = engine.run([ids], seeds=[1])  # (the model as it is: its own adapter)
    engine.add_request(ids, seed=1, adapter="plus")
    while engine.has_unfinished():
        engine.step()
    assert model.model.active_adapter == "default"
    assert sorted(n for n, p in model.model.named_parameters() if p.requires_grad) == trainable and trainable
    assert torch.equal(engine.run([ids], seeds=[1]).completion_ids, want) and torch.equal(first.completion_ids, want)


def test_selected_logprobs_take_each_rows_adapter(adapters):
    """A scoring forward (``select``) with ``adapter_names`` gives each row its adapter's log-probabilities, as
    the logits of that adapter alone do."""
    from dllm_rl.models.diffusion_lm import Selection
    from dllm_rl.training.lora import active_adapter

    model = load_named_adapters(_demo(), {"plus": adapters / "plus", "minus": adapters / "minus"})
    ids = torch.randint(3, 60, (3, 10), generator=torch.Generator().manual_seed(0))
    rows, cols = torch.tensor([0, 1, 2, 2]), torch.tensor([2, 5, 1, 9])
    names = ["plus", "__base__", "minus"]
    with torch.no_grad():
        got = model(ids, select=Selection(rows, cols, ids[rows, cols], 16), adapter_names=names).logprobs
        for k, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
            with active_adapter(model, None if names[r] == "__base__" else names[r]):
                alone = model(ids[r : r + 1]).logits[0, c].log_softmax(-1)[ids[r, c]]
            torch.testing.assert_close(got[k], alone, atol=1e-5, rtol=0)


def test_an_adapter_peft_cannot_batch_is_refused_at_start(tmp_path):
    """DoRA adapters cannot share a forward with others in peft: the server refuses them before it serves."""
    from peft import LoraConfig, get_peft_model

    from dllm_rl.serve.cli import build_server
    from dllm_rl.serve.config import ServeConfig

    model = _demo()
    model.model = get_peft_model(model.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=True))
    save_adapter(model, tmp_path / "dora")
    with pytest.raises(UserError, match=r"^--lora: LoRA adapter 'd' uses DoRA, which peft cannot batch beside other "
                                        r"adapters; merge it into the model and serve the merged checkpoint$"):
        build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), loras={"d": str(tmp_path / "dora")})


def test_bad_lora_flags_and_folders_end_in_one_line(tmp_path):
    from dllm_rl.serve.cli import build_server, parse_loras
    from dllm_rl.serve.config import ServeConfig

    assert parse_loras(["a=x", "b=y/z"]) == {"a": "x", "b": "y/z"}
    with pytest.raises(UserError, match="--lora: 'a' is not NAME=DIR"):
        parse_loras(["a"])
    with pytest.raises(UserError, match="--lora: the name 'a' is given twice"):
        parse_loras(["a=x", "a=y"])
    with pytest.raises(UserError, match="holds no adapter_config.json"):
        build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), loras={"a": str(tmp_path)})
    with pytest.raises(UserError, match="is the base model's name"):
        build_server(str(DEMO / "sdar-countdown"), BASE, ServeConfig(), loras={"sdar-countdown": str(tmp_path)})
