"""The shipped demo checkpoints and their held-out file (their accuracy: tests/eval/test_eval_demo.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from dllm_rl.eval.demo import DEMO_DIR, HELDOUT
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.sft.config import ModelConfig
from dllm_rl.sft.model_build import build_tokenizer_and_model

# family, block size, tokens of "<answer>3*5+7</answer>" (the LLaDA demo tokenizer has one token per tag)
DEMOS = {"llada-countdown": ("llada", None, 7), "sdar-countdown": ("sdar", 4, 22),
         "gemma-countdown": ("diffusion_gemma", 16, 7)}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_shipped_checkpoint_is_small_and_loads(name):
    path = DEMO_DIR / name
    family, block, answer_tokens = DEMOS[name]
    size = sum(f.stat().st_size for f in path.iterdir())
    assert size < 10 * 2**20
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in path.iterdir()}
    dlm = load_model(path)
    tok = load_tokenizer(path, mask_token_id=dlm.mask_token_id, noise=dlm.family.noise)
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


def test_the_gemma_demo_checkpoint_is_in_the_published_layout():
    """DiffusionGemma's published layout: the stock architecture, a text_config with the MoE shape (4 experts, 2 per
    token), a sliding and a full layer, one canvas of 16, the tied encoder copies and lm_head left out of the file."""
    from safetensors import safe_open

    path = DEMO_DIR / "gemma-countdown"
    pub = json.loads((path / "config.json").read_text())
    text = pub["text_config"]
    assert (pub["architectures"], pub["model_type"], pub["canvas_length"]) == (
        ["DiffusionGemmaForBlockDiffusion"], "diffusion_gemma", 16)
    assert (text["num_experts"], text["top_k_experts"], text["enable_moe_block"]) == (4, 2, True)
    assert set(text["layer_types"]) == {"sliding_attention", "full_attention"}
    assert text["layer_types"][-1] == "full_attention"
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.decoder.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert not any(n.startswith("model.encoder.language_model.layers.") and n.endswith("_proj.weight") for n in names)
    assert load_model(path).mask_token_id is None


def test_sft_builds_a_fresh_diffusion_gemma_at_the_configured_moe_shape():
    """`dllm-rl sft` with model.family=diffusion_gemma: no mask id reaches the uniform-state family, the vocabulary is
    the tokenizer's plus the three image ids the tiny config reserves, the MoE keys set the experts."""
    cfg = ModelConfig(family="diffusion_gemma", tokenizer="char", words=["<answer>", "</answer>"], hidden_size=32,
                      num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32, block_size=8, num_experts=3,
                      experts_per_token=1, moe_intermediate_size=8)
    tok, dlm = build_tokenizer_and_model(cfg)
    hf = dlm.model.config
    assert dlm.family.name == "diffusion_gemma" and dlm.mask_token_id is None and dlm.block_size == 8
    assert dlm.model.get_input_embeddings().weight.shape[0] == len(tok) + 3 == hf.image_token_id + 1
    assert (hf.text_config.num_experts, hf.text_config.top_k_experts, hf.text_config.moe_intermediate_size) == (3, 1, 8)


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), ("cuda", torch.bfloat16)])
def test_model_dtype_auto_is_resolved_for_the_training_device(device, dtype):
    """model.dtype=auto (the shared dtype words) reaches the builder and the loader as bfloat16 for CUDA, float32
    elsewhere; the model is only built here (the trainer moves it), so no GPU is needed."""
    cfg = ModelConfig(tokenizer="char", dtype="auto", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32)
    _, dlm = build_tokenizer_and_model(cfg, device=device)
    assert next(dlm.parameters()).dtype == dtype
    assert next(build_tokenizer_and_model(replace(cfg, path=str(DEMO_DIR / "llada-countdown"), tokenizer=None),
                                          device=device)[1].parameters()).dtype == dtype
