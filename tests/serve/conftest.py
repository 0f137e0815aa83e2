"""Fixtures of the serve tests: the shipped demo block model (with a minimal chat template) and servers over it."""

from __future__ import annotations

import pytest
from serve_helpers import CHAT_TEMPLATE, DEMO


@pytest.fixture(scope="module")
def demo_model():
    from dllm_rl.models import load_model, load_tokenizer

    model = load_model(DEMO / "sdar-countdown")
    tokenizer = load_tokenizer(DEMO / "sdar-countdown", mask_token_id=model.mask_token_id)
    tokenizer.chat_template = CHAT_TEMPLATE
    return model, tokenizer


@pytest.fixture
def make_server(demo_model):
    """``make_server(decode=DecodeConfig, api_key=None, **limits)``: a Server over the demo block model (not
    started)."""
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    def make(decode, api_key=None, **limits):
        model, tokenizer = demo_model
        return Server(model, tokenizer, decode, ServeConfig(**limits), "sdar-countdown", api_key=api_key)

    return make
