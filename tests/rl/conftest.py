"""A tiny countdown set-up shared by the RL trainer tests: data files and tiny checkpoints."""

from __future__ import annotations

import pytest
from rl_helpers import countdown_root

from dllm_rl.models import char_tokenizer


@pytest.fixture(scope="session")
def rl_setup(tmp_path_factory):
    return countdown_root(tmp_path_factory.mktemp("rl"), ("llada", "sdar"), 32, 4, hidden_size=32,
                          intermediate_size=64, num_heads=2, num_kv_heads=1)


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
