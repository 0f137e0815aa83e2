"""LLaDA (GSAI-ML/LLaDA-8B-Instruct): OLMo-style tensor names, Llama maths, bidirectional attention."""

from __future__ import annotations

import re
from typing import Any

from transformers import LlamaConfig, PretrainedConfig

from dllm_rl.errors import UserError
from dllm_rl.models.families.base import Family, ids, require, rope_theta

_BLOCK = {
    "attn_norm": "input_layernorm",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}
_BLOCK_INV = {v: k for k, v in _BLOCK.items()}
_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
_TOP_INV = {v: k for k, v in _TOP.items()}


class LLaDA(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, ["d_model", "n_heads", "n_layers", "vocab_size"], "llada")
        d_model, n_heads = int(pub["d_model"]), int(pub["n_heads"])
        mlp = pub.get("mlp_hidden_size") or int(pub.get("mlp_ratio", 4) * d_model)
        rows = int(pub.get("embedding_size") or pub["vocab_size"])
        return LlamaConfig(
            vocab_size=rows,
            hidden_size=d_model,
            intermediate_size=int(mlp),
            num_hidden_layers=int(pub["n_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(pub.get("n_kv_heads") or n_heads),
            head_dim=d_model // n_heads,
            max_position_embeddings=int(pub.get("max_sequence_length", 4096)),
            rms_norm_eps=float(pub.get("rms_norm_eps", 1e-5)),
            rope_parameters={"rope_type": "default", "rope_theta": float(pub.get("rope_theta", 10000.0))},
            tie_word_embeddings=bool(pub.get("weight_tying", False)),
            attention_bias=bool(pub.get("include_bias", False) or pub.get("include_qkv_bias", False)),
            mlp_bias=False,
            pad_token_id=pub.get("pad_token_id"),
            eos_token_id=pub.get("eos_token_id"),
            bos_token_id=pub.get("bos_token_id"),
        )

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = dict(base or {})
        pub.setdefault("vocab_size", hf.vocab_size)
        pub.update(
            model_type=self.model_type,
            architectures=list(self.architectures),
            auto_map=dict(self.auto_map),
            d_model=hf.hidden_size,
            n_heads=hf.num_attention_heads,
            n_kv_heads=hf.num_key_value_heads,
            n_layers=hf.num_hidden_layers,
            mlp_hidden_size=hf.intermediate_size,
            mlp_ratio=max(1, hf.intermediate_size // hf.hidden_size),
            embedding_size=hf.vocab_size,
            max_sequence_length=hf.max_position_embeddings,
            rope_theta=rope_theta(hf),
            rope=True,
            rms_norm_eps=hf.rms_norm_eps,
            weight_tying=bool(hf.tie_word_embeddings),
            block_type="llama",
            layer_norm_type="rms",
            activation_type="silu",
            include_bias=False,
            include_qkv_bias=bool(hf.attention_bias),
            attention_layer_norm=False,
            scale_logits=False,
        )
        pub.setdefault("mask_token_id", self.mask_token_id)
        pub.setdefault("eos_token_id", self.eos_token_id)
        pub.setdefault("pad_token_id", self.pad_token_id)
        return pub

    def tiny(self, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
             mask_token_id, eos_token_id, pad_token_id, max_position_embeddings, tie_word_embeddings, rope_theta,
             **_: Any) -> dict[str, Any]:
        mask, eos, pad = ids(self, vocab_size, mask_token_id, eos_token_id, pad_token_id)
        return {
            "model_type": self.model_type, "architectures": list(self.architectures), "auto_map": dict(self.auto_map),
            "d_model": hidden_size, "n_heads": num_heads, "n_kv_heads": num_kv_heads, "n_layers": num_layers,
            "mlp_hidden_size": intermediate_size, "vocab_size": vocab_size, "embedding_size": vocab_size,
            "max_sequence_length": max_position_embeddings, "rope_theta": rope_theta, "rms_norm_eps": 1e-5,
            "weight_tying": tie_word_embeddings, "mask_token_id": mask, "eos_token_id": eos,
            "pad_token_id": pad, "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu",
        }

    def to_hf_name(self, name: str) -> str:
        if name in _TOP:
            return _TOP[name]
        m = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)", name)
        if m and m.group(2) in _BLOCK:
            return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"
        raise UserError(f"llada: unexpected tensor name {name!r}")

    def to_published_name(self, name: str) -> str:
        if name in _TOP_INV:
            return _TOP_INV[name]
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if m and m.group(2) in _BLOCK_INV:
            return f"model.transformer.blocks.{m.group(1)}.{_BLOCK_INV[m.group(2)]}.{m.group(3)}"
        raise UserError(f"llada: no published name for {name!r}")

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("weight_tying", False))


LLADA = LLaDA(
    name="llada", attention="full", shift=False, mask_token_id=126336, eos_token_id=126081,
    pad_token_id=126081, model_type="llada", architectures=("LLaDAModelLM",), mask_token="<|mdm_mask|>",
    auto_map={
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModel": "modeling_llada.LLaDAModelLM",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
    },
)
