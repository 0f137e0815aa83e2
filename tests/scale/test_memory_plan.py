"""benchmarks/memory_plan.py: the arithmetic on a hand-computed tiny model, and its parameter counts against
transformers' own models (built on the meta device) for every family and shipped config."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from dllm_rl.models import get_family, tiny_config

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("memory_plan", ROOT / "benchmarks" / "memory_plan.py")
mp = importlib.util.module_from_spec(_spec)
sys.modules["memory_plan"] = mp  # dataclasses look their module up there
_spec.loader.exec_module(mp)

# H=8, 2 layers, 2 heads of hd=4, 1 kv head, F=16, V=32, untied.
TINY = tiny_config("llada", vocab_size=32, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                   intermediate_size=16)


def _write(tmp_path, pub) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(pub))
    return path


def _meta_count(hf_config) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def test_tiny_llada_by_hand(tmp_path):
    s = mp.read_shape(_write(tmp_path, TINY))
    # per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192, norms 16, MLP 3*8*16 = 384 -> 592
    assert mp.layer_params(s, moe=False) == 592
    # embedding 32*8 + head 32*8 + final norm 8 + 2 layers
    assert mp.param_count(s) == 256 + 256 + 8 + 2 * 592 == 1704
    # a = 4*8 + 2*2*4 + 2*1*4 + 4*16 = 120 elements per token and layer
    assert mp.activation_elements_per_token_layer(s) == 120


def test_tiny_zero2_rows_in_bytes(tmp_path):
    s = mp.read_shape(_write(tmp_path, TINY))
    r = mp.Recipe(gpus=2, backend="zero2", dtype="bf16", prompt_len=4, gen_len=4, rollouts_per_gpu=2, micro_batch=1)
    rows = mp.plan(s, r)
    assert rows == {
        "parameters": 1704 * 2,  # replicated under ZeRO-2
        "gradients": 1704 * 2 // 2,
        "optimizer m+v (fp32)": 1704 * 8 // 2,
        "fp32 master": 1704 * 4 // 2,
        "reference policy": 0,
        "activations": 8 * 2 * 120 * 2,  # 8 tokens x 2 layers x a x 2 bytes = 3840
        "LM-head logits (fp32)": 8 * 32 * 4,
        "rollout KV cache": 2 * 8 * 2 * 2 * 1 * 4 * 2,  # rollouts x tokens x layers x (k, v) x nkv x hd x 2 B
    }
    full, chunked = mp.totals(rows)
    assert (full, chunked) == (3408 + 1704 + 6816 + 3408 + 3840 + 1024 + 512, 3408 + 1704 + 6816 + 3408 + 3840 + 512)


def test_tiny_fsdp2_checkpointing_lora_reference(tmp_path):
    s = mp.read_shape(_write(tmp_path, TINY))
    base = dict(gpus=2, dtype="bf16", prompt_len=4, gen_len=4, rollouts_per_gpu=2, micro_batch=1)
    rows = mp.plan(s, mp.Recipe(backend="fsdp2", gradient_checkpointing=True, reference=True, **base))
    assert rows["parameters"] == rows["reference policy"] == 1704
    assert rows["gradients"] == 1704 and rows["optimizer m+v (fp32)"] == 6816 and rows["fp32 master"] == 3408
    assert rows["gathered layers (2)"] == 2 * 592 * 2
    assert rows["activations"] == 8 * (2 * 8 + 120) * 2  # each layer's input + one layer recomputed = 2176
    # LoRA r=2: attention 2*((8+8) + 2*(8+4) + (8+8)) = 112, MLP 3*2*(8+16) = 144, per layer 256 -> 512
    assert mp.lora_params(s, 2) == 512
    lora = mp.plan(s, mp.Recipe(backend="ddp", lora_r=2, reference=True, **base))
    assert lora["parameters"] == (1704 + 512) * 2 and lora["gradients"] == 512 * 2
    assert lora["optimizer m+v (fp32)"] == 512 * 8 and lora["reference policy"] == 0


def test_offload_moves_states_to_cpu_rows(tmp_path):
    s = mp.read_shape(_write(tmp_path, TINY))
    rows = mp.plan(s, mp.Recipe(gpus=2, backend="zero3-offload", dtype="fp32", prompt_len=4, gen_len=4,
                                rollouts_per_gpu=2, micro_batch=1))
    assert rows["parameters"] == 0 and rows["cpu parameters"] == 1704 * 4 // 2
    assert rows["cpu fp32 master"] == 0  # fp32 training keeps no separate master copy
    assert rows["gathered layers (2)"] == 2 * 592 * 4
    gpu, _ = mp.totals(rows)
    kv = 2 * 8 * 2 * 2 * 4 * 4
    assert gpu == rows["gathered layers (2)"] + rows["activations"] + rows["LM-head logits (fp32)"] + kv


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_dense_counts_equal_transformers_models(tmp_path, family):
    pub = tiny_config(family, vocab_size=48, hidden_size=16, num_layers=3, num_heads=4, num_kv_heads=2,
                      intermediate_size=40)
    s = mp.read_shape(_write(tmp_path, pub))
    assert mp.param_count(s) == _meta_count(get_family(family).hf_config(pub))


@pytest.mark.parametrize("name", ["llada-8b-instruct", "dream-v0-instruct-7b", "trado-8b-instruct"])
def test_shipped_dense_configs_equal_transformers_models(name):
    path = ROOT / "configs" / "models" / f"{name}.json"
    pub = json.loads(path.read_text())
    from dllm_rl.models import detect_family
    assert mp.param_count(mp.read_shape(path)) == _meta_count(detect_family(pub).hf_config(pub))


def test_moe_count_equals_qwen3_moe_model():
    path = ROOT / "configs" / "models" / "llada-moe-7b-a1b.json"
    s = mp.read_shape(path)
    assert (s.experts, s.top_k, s.moe_layers, s.expert_intermediate) == (64, 8, 16, 1024)
    hf = Qwen3MoeConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                        num_experts=s.experts, num_experts_per_tok=s.top_k, moe_intermediate_size=1024,
                        intermediate_size=s.intermediate, tie_word_embeddings=False)
    assert mp.param_count(s) == _meta_count(hf)


def test_cli_prints_table_and_fit(tmp_path, capsys):
    path = _write(tmp_path, TINY)
    assert mp.main([str(path), "--gpus", "2", "--backend", "zero2", "--prompt-len", "4", "--gen-len", "4",
                    "--rollouts-per-gpu", "2", "--micro-batch", "1", "--gpu-mem", "0.0000165"]) == 0
    out = capsys.readouterr().out
    # 0.0000165 GiB = 17716 bytes: neither the full-logit total (20712) nor the chunked one (19688) fits
    assert "total, full logits" in out and "20,712  does NOT fit" in out and "19,688  does NOT fit" in out
    assert mp.main([str(path), "--gpus", "2", "--backend", "zero2", "--prompt-len", "4", "--gen-len", "4",
                    "--rollouts-per-gpu", "2", "--micro-batch", "1", "--gpu-mem", "0.0000192"]) == 0
    out = capsys.readouterr().out  # 20615 bytes: only the chunked total fits
    assert "20,712  does NOT fit" in out and "19,688  fits" in out


def test_bad_config_names_the_file(tmp_path, capsys):
    path = _write(tmp_path, {"model_type": "llada", "num_experts": 4, "hidden_size": 8})
    assert mp.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: MoE config is missing num_hidden_layers, num_attention_heads, vocab_size" in err
