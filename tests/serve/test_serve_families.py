"""`dllm-rl serve` over every published family's layout (tiny random models with a character tokenizer): a request
through the HTTP server gets what `generate` gives its prompt alone."""

from __future__ import annotations

import httpx
import pytest
import torch
from serve_helpers import alone_answer, running

from dllm_rl.models import build_model, char_tokenizer, get_family, tiny_config
from dllm_rl.sampling import DecodeConfig

TEXT_FAMILIES = ["llada", "dream", "sdar", "llada2", "llada_moe", "sdar_moe", "fast_dllm_v2"]
# full-attention families also with Fast-dLLM's caches (`dllm-rl serve --cache dual`); MDPO's RCR remasking
# (`--remasking rcr --steps 4`) on both kinds of attention
RCR = {"remasking": "rcr", "steps": 4, "threshold": None}
CASES = [(f, {}) for f in TEXT_FAMILIES] + [("llada", {"cache": "dual"}), ("dream", {"cache": "prefix"}),
                                            ("llada", RCR), ("sdar", RCR)]


@pytest.mark.parametrize(("family", "decoding"), CASES,
                         ids=[f"{f}-{'-'.join(map(str, d.values())) or 'none'}" for f, d in CASES])
def test_a_completion_of_every_family_equals_generate(family, decoding):
    from dllm_rl.serve.app import Server
    from dllm_rl.serve.config import ServeConfig

    tok = char_tokenizer()
    block = {"block_size": 4} if get_family(family).attention == "block" else {}
    cfg = tiny_config(family, vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **block)
    model = build_model(family, cfg, seed=1)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(20.0)  # some confidences over the threshold
    decode = DecodeConfig(**{"gen_length": 8, "block_length": 4, "threshold": 0.6, **decoding})
    ids = tok.encode("12+3=", add_special_tokens=False)
    with running(Server(model, tok, decode, ServeConfig(slots=2), family)) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 8, "temperature": 0.7, "seed": 5})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
    alone = DecodeConfig(**{"gen_length": 8, "block_length": 4, "threshold": 0.6, "temperature": 0.7, "seed": 5,
                            **decoding})
    text, reason = alone_answer(model, tok, ids, alone, 8)
    assert (choice["text"], choice["finish_reason"]) == (text, reason) and text
