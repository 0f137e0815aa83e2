"""The shipped demo checkpoints and the accuracy command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm_rl.models import load_model, load_tokenizer, save_model
from dllm_rl.sft.demo_eval import DEMO_DIR, HELDOUT, decode_lengths, evaluate, main
from dllm_rl.sft.trainer import ModelConfig, build_tokenizer_and_model

# family, block size, tokens of "<answer>3*5+7</answer>" (the LLaDA demo tokenizer has one token per tag)
DEMOS = {"llada-countdown": ("llada", None, 7), "sdar-countdown": ("sdar", 4, 22)}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_shipped_checkpoint_is_small_and_loads(name):
    path = DEMO_DIR / name
    family, block, answer_tokens = DEMOS[name]
    size = sum(f.stat().st_size for f in path.iterdir())
    assert size < 10 * 2**20
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in path.iterdir()}
    dlm = load_model(path)
    tok = load_tokenizer(path, mask_token_id=dlm.mask_token_id)
    assert dlm.family.name == family and dlm.block_size == block
    assert 500_000 <= dlm.num_parameters() <= 5_000_000
    assert tok.decode(tok.encode("nums 3 5 7 target 22\n", add_special_tokens=False)) == "nums 3 5 7 target 22\n"
    answer = tok.encode("<answer>3*5+7</answer>", add_special_tokens=False)
    assert len(answer) == answer_tokens and tok.decode(answer) == "<answer>3*5+7</answer>"


def test_heldout_file_is_countdown():
    rows = [json.loads(x) for x in HELDOUT.read_text().splitlines()]
    assert len(rows) == 500 and {"nums", "target", "solution"} <= set(rows[0])


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_shipped_checkpoint_solves_some_heldout_puzzles(name):
    res = evaluate(DEMO_DIR / name, n=40, batch_size=40)
    assert res["n"] == 40 and res["accuracy"] >= 0.1, res["samples"]  # greedy: llada 14/40, sdar 7/40
    assert all(s["completion"].startswith("<answer>") for s in res["samples"])


def test_demo_eval_decodes_each_demo_model_as_its_rl_config_does():
    assert decode_lengths(DEMO_DIR / "llada-countdown") == (16, 16)
    assert decode_lengths(DEMO_DIR / "sdar-countdown") == (32, 4)
    assert decode_lengths(DEMO_DIR / "elsewhere") == (32, 32)
    res = evaluate(DEMO_DIR / "llada-countdown", n=2, batch_size=2, gen_length=8)  # block follows gen_length
    assert (res["decode"]["gen_length"], res["decode"]["block_length"]) == (8, 8)


def test_demo_eval_command_on_a_fresh_model(tmp_path, capsys):
    tok, dlm = build_tokenizer_and_model(ModelConfig(tokenizer="char", hidden_size=32, num_layers=1,
                                                     intermediate_size=32, num_heads=2, num_kv_heads=2))
    save_model(dlm, tmp_path / "m", tokenizer=tok)
    assert main([str(tmp_path / "m"), "--n", "3", "--gen-length", "8", "--block-length", "8"]) == 0
    out = capsys.readouterr().out
    assert "countdown accuracy 0.000 (0/3) greedy, gen_length 8, block 8, steps/block 8" in out
    assert main([str(tmp_path / "nope")]) == 2
    (tmp_path / "empty.jsonl").write_text("")
    capsys.readouterr()
    assert main([str(tmp_path / "m"), "--data", str(tmp_path / "empty.jsonl"), "--gen-length", "8"]) == 2
    assert capsys.readouterr().err == (f"demo_eval: error: {tmp_path / 'empty.jsonl'}: no held-out examples (--data); "
                                       "give a file with at least one item\n")
    assert Path(HELDOUT).is_file()


def test_fresh_model_with_word_tokens_is_sized_to_its_tokenizer():
    tok, dlm = build_tokenizer_and_model(ModelConfig(tokenizer="char", words=["<answer>", "</answer>"],
                                                     hidden_size=32, num_layers=1, intermediate_size=32,
                                                     num_heads=2, num_kv_heads=2))
    assert len(tok) == 93 and tok.convert_tokens_to_ids("</answer>") == 92
    assert dlm.model.get_input_embeddings().weight.shape[0] == 93
