"""A tiny countdown set-up shared by the RL trainer tests: data files and tiny checkpoints."""

from __future__ import annotations

import pytest

from dllm_rl.jsonl import write_jsonl
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
from dllm_rl.tasks.synthetic import make_countdown


@pytest.fixture(scope="session")
def rl_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    write_jsonl(root / "train.jsonl", make_countdown(32, seed=0, numbers=3, max_value=9))
    write_jsonl(root / "test.jsonl", make_countdown(4, seed=1, numbers=3, max_value=9))
    tok = char_tokenizer()
    for fam in ("llada", "sdar"):
        cfg = tiny_config(fam, vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, hidden_size=32, intermediate_size=64, num_heads=2,
                          num_kv_heads=1)
        save_model(build_model(fam, cfg, seed=0), root / fam, tokenizer=tok)
    return root


@pytest.fixture(scope="session")
def image_rl_setup(tmp_path_factory):
    """The shapes task (32 px images written as ``dllm-rl data make shapes`` writes them) and tiny checkpoints of
    both image families (tests/image_fixture.py)."""
    from image_fixture import write_image_checkpoints

    from dllm_rl.tasks.shapes import make_shapes, write_shapes

    root = tmp_path_factory.mktemp("rl_images")
    write_shapes(root / "train.jsonl", make_shapes(8, seed=0, size=32))
    write_shapes(root / "test.jsonl", make_shapes(2, seed=1, size=32, split="test"))
    write_image_checkpoints(root, char_tokenizer())
    return root
