"""The shipped demo checkpoints and their held-out file (their accuracy: tests/eval/test_eval_demo.py)."""

from __future__ import annotations

import json

import pytest

from dllm_rl.eval.demo import DEMO_DIR, HELDOUT
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.sft.config import ModelConfig
from dllm_rl.sft.model_build import build_tokenizer_and_model

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


def test_fresh_model_with_word_tokens_is_sized_to_its_tokenizer():
    tok, dlm = build_tokenizer_and_model(ModelConfig(tokenizer="char", words=["<answer>", "</answer>"],
                                                     hidden_size=32, num_layers=1, intermediate_size=32,
                                                     num_heads=2, num_kv_heads=2))
    assert len(tok) == 93 and tok.convert_tokens_to_ids("</answer>") == 92
    assert dlm.model.get_input_embeddings().weight.shape[0] == 93
