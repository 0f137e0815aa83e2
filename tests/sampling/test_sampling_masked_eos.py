"""Several EOS ids on a masked family (a Qwen3 chat model's generation_config.json lists end of turn and end of text):
a row ends on any of them, in the fixed-batch sampler, the engine (its EOS stop, its early stop, prefilled blocks),
the server's answer and stream, RL's step predictions and ``dllm-rl info``; a one-id model decodes as before."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from dllm_rl.models import DiffusionLM, build_model, char_tokenizer, get_family, save_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.engine import Engine, EngineConfig

PAD, EOS, MASK = 0, 1, 2  # the character tokenizer's ids; characters "abcdefghijkl" are ids 4 .. 15
SECOND = 9  # "f": the second EOS id (end of text after end of turn), a plain token to a one-id model
TOK = char_tokenizer("abcdefghijkl")
PROMPTS = [[4, 4, 4, 4], [4, 4]]
# at positions 2 .. 6 the model says "h i b c d" (ids 11 12 5 6 7), from position 7 on SECOND: the row of prompt 0
# answers "bcd" then SECOND, the row of prompt 1 "bcd" after "hi"
ROWS = {2: (11, 0.9), 3: (12, 0.9), 4: (5, 0.9), 5: (6, 0.9), 6: (7, 0.9), **{p: (SECOND, 0.9) for p in range(7, 64)}}
DECODE = DecodeConfig(gen_length=16, block_length=4, steps=16)


def _pair(fakes, family: str) -> tuple[DiffusionLM, DiffusionLM]:
    """The position-table model with one EOS id, and the same module whose generation_config lists two."""
    pub = {"mask_token_id": MASK, "eos_token_id": EOS, "pad_token_id": PAD}
    if family == "sdar":
        pub["block_size"] = 4
    hf = fakes.FakeHF(fakes.table_from(ROWS))
    one = DiffusionLM(hf, get_family(family), pub)
    two = DiffusionLM(hf, get_family(family), pub, {"eos_token_id": [EOS, SECOND]})
    assert (one.eos_token_ids, two.eos_token_ids, two.eos_token_id) == ((EOS,), (EOS, SECOND), EOS)
    return one, two


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_fixed_batch_sampler_ends_a_row_on_the_second_eos_id(fakes, family):
    """With one id both rows decode to gen_length (SECOND is a plain token); with two each ends at the block after its
    first SECOND (a block of only EOS ids): the completion mask runs up to and including that SECOND, the rest is the
    first id's fill (never generated), the reason is "eos" and the text leaves SECOND out. The tokens up to the stop
    are the one-id model's."""
    one, two = _pair(fakes, family)
    before, roll = generate(one, PROMPTS, DECODE), generate(two, PROMPTS, DECODE, tokenizer=TOK)
    assert before.finish_reason == ["length", "length"] and (before.completion_ids[:, 7:16] == SECOND).all()
    assert roll.finish_reason == ["eos", "eos"] and roll.texts == ["bcd", "hibcd"]
    assert roll.completion_mask.sum(1).tolist() == [4, 6]
    ended = {"llada": [8, 12], "sdar": [8, 10]}[family]  # the first slot after the stopping block
    assert roll.nfe.tolist() == ended
    for b, end in enumerate(ended):
        assert torch.equal(roll.completion_ids[b, :end], before.completion_ids[b, :end])
        assert (roll.completion_ids[b, end:16] == EOS).all() and (roll.step_map[b, end:] == -1).all()
    assert roll.completion_ids[0, :4].tolist() == [5, 6, 7, SECOND]


@pytest.mark.parametrize("family", ["llada", "sdar"])
@pytest.mark.parametrize("early_stop", [False, True])
def test_the_engine_ends_a_request_where_generate_ends_it(fakes, family, early_stop):
    """The engine's request ends on SECOND as ``generate`` ends it: the same tokens, mask, reason and step map (its
    early stop: at once, the same answer); it reports both ids (the server's stream cuts its settled text there)."""
    _, two = _pair(fakes, family)
    engine = Engine(two, DECODE, EngineConfig(slots=2, early_stop=early_stop), tokenizer=TOK)
    assert engine.eos_ids == (EOS, SECOND)
    got, want = engine.run(PROMPTS), generate(two, PROMPTS, DECODE, tokenizer=TOK)
    assert got.finish_reason == ["eos", "eos"] and got.texts == want.texts == ["bcd", "hibcd"]
    assert torch.equal(got.completion_mask, want.completion_mask)
    if early_stop:  # stopped once SECOND and every slot before it were committed: row 0 right after its answer
        assert got.nfe[0] == 4 and (got.completion_ids[0, 4:16] == EOS).all() and (got.nfe < want.nfe).all()
    else:
        for name in ("completion_ids", "step_map", "nfe"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_a_prefilled_block_of_the_second_id_ends_the_request(fakes):
    """A prefill that leaves a block holding only SECOND ends the answer there, in ``generate`` and the engine."""
    _, two = _pair(fakes, "llada")
    prefill = {k: SECOND for k in range(4, 8)}
    want = generate(two, PROMPTS[:1], DECODE, prefill=[prefill])
    got = Engine(two, DECODE).run(PROMPTS[:1], prefill=[prefill])
    assert want.finish_reason == got.finish_reason == ["eos"]
    assert torch.equal(want.completion_ids, got.completion_ids) and (got.completion_ids[0, 8:] == EOS).all()


def test_without_the_eos_stop_a_row_runs_to_its_length_and_its_answer_ends_on_the_second_id(fakes):
    """``stop_on_eos=false`` decodes every block (the tokens of the one-id model), yet the answer still ends at the
    first EOS of any id: the reason says why the answer ended ("eos"), as OpenAI's "stop" (a natural end, the text
    cut there), not "length" (which tells a client its text was cut by its token budget)."""
    one, two = _pair(fakes, "sdar")
    free = DecodeConfig(**{**vars(DECODE), "stop_on_eos": False})
    before, roll = generate(one, PROMPTS, free), generate(two, PROMPTS, free, tokenizer=TOK)
    assert torch.equal(roll.completion_ids, before.completion_ids) and torch.equal(roll.nfe, before.nfe)
    assert roll.finish_reason == ["eos", "eos"] and before.finish_reason == ["length", "length"]
    assert roll.completion_mask.sum(1).tolist() == [4, 6] and roll.texts == ["bcd", "hibcd"]


@pytest.mark.parametrize("stop_on_eos", [True, False])
def test_the_server_answers_and_streams_up_to_the_second_id(fakes, stop_on_eos):
    """The server's text ends before SECOND with ``finish_reason: "stop"``, whole and streamed, with or without the
    sampler's EOS stop; a budget that cuts the answer first is "length"."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
    from serve_helpers import running

    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    _, two = _pair(fakes, "sdar")
    decode = DecodeConfig(**{**vars(DECODE), "stop_on_eos": stop_on_eos})
    with running(Server(two, TOK, decode, ServeConfig(slots=2, max_tokens=16), "tiny")) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            body = {"prompt": PROMPTS[0], "max_tokens": 16}
            whole = client.post("/v1/completions", json=body).json()["choices"][0]
            short = client.post("/v1/completions", json={**body, "max_tokens": 2}).json()["choices"][0]
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                events = [json.loads(line[6:]) for line in resp.iter_lines()
                          if line.startswith("data: ") and line[6:] != "[DONE]"]
    assert (whole["text"], whole["finish_reason"]) == ("bcd", "stop")
    assert (short["text"], short["finish_reason"]) == ("bc", "length")
    assert "".join(e["choices"][0]["text"] for e in events) == "bcd"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_step_predictions_end_on_either_id():
    """RL's rewarded step predictions (MDPO, EGSPO) cut their answer and text at the first EOS of any id."""
    from dllm_rl.rl.step_predictions import prediction_texts

    tokens = torch.tensor([[5, 6, SECOND, 7, EOS], [5, EOS, SECOND, 7, 7]])
    assert prediction_texts(tokens, TOK, (EOS, SECOND), PAD, MASK) == ["bc", "b"]
    assert prediction_texts(tokens, TOK, EOS, PAD, MASK) == ["bcfd", "b"]


def test_info_shows_every_eos_id(tmp_path, capsys):
    """``dllm-rl info`` of a checkpoint whose generation_config.json lists two EOS ids shows both (the text and the
    JSON); a one-id checkpoint's line is as before."""
    from dllm_rl.cli import main

    model = build_model("sdar", tiny_config("sdar", vocab_size=16, hidden_size=32, num_layers=1, num_heads=2,
                                            num_kv_heads=1, intermediate_size=32, block_size=4,
                                            mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD), seed=0)
    save_model(model, tmp_path, tokenizer=TOK)
    assert main(["info", str(tmp_path)]) == 0
    assert "eos_token_id   1\n" in capsys.readouterr().out
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, SECOND]}))
    assert main(["info", str(tmp_path)]) == 0
    assert "eos_token_ids  1, 9 (each ends a row; the first is the one appended)" in capsys.readouterr().out
    assert main(["info", str(tmp_path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["eos_token_id"], facts["eos_token_ids"]) == (EOS, [EOS, SECOND])


OUTSIDE = "is outside the vocabulary (vocab_size 16: ids 0 to 15); fix the checkpoint's file"


@pytest.mark.parametrize("file, value, problem", [
    ("generation_config.json", [EOS, "a"], "expected a token id or a list of token ids, got [1, 'a']"),
    ("generation_config.json", "1", "expected a token id or a list of token ids, got '1'"),
    ("generation_config.json", 1.5, "expected a token id or a list of token ids, got 1.5"),
    ("generation_config.json", [EOS, 16], f"id 16 {OUTSIDE}"),
    ("generation_config.json", -1, f"id -1 {OUTSIDE}"),
    ("config.json", [99, EOS], f"id 99 {OUTSIDE}"),
])
def test_an_eos_id_that_is_not_a_token_of_the_vocabulary_is_refused_in_one_line(tmp_path, capsys, file, value,
                                                                                   problem):
    """An EOS id that is not an integer, or lies outside the vocabulary, is refused when the checkpoint is read,
    naming the file and key: one line, exit 2 (a string id was a traceback; an id beyond the vocabulary, first in the
    list, made SFT append it and fail in the embedding with an IndexError)."""
    from dllm_rl.cli import main

    model = build_model("sdar", tiny_config("sdar", vocab_size=16, hidden_size=32, num_layers=1, num_heads=2,
                                            num_kv_heads=1, intermediate_size=32, block_size=4,
                                            mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD), seed=0)
    save_model(model, tmp_path, tokenizer=TOK)
    path = tmp_path / file
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**data, "eos_token_id": value}))
    capsys.readouterr()
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip() == f"dllm-rl info: error: {file}: eos_token_id: {problem}"
