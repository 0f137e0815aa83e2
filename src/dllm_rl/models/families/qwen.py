"""Qwen-named dense families, whose tensor names are already HF's.

* Dream / DiffuCoder / Dream-Coder (Qwen2, full attention, logits shifted by one);
* SDAR / TraDo (Qwen3, block-causal, block 4);
* Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_1.5B / 7B; Qwen2.5 weights, block-causal with the
  config's ``bd_size`` 32, logits shifted as Dream's). The published model builds its own block-causal
  mask from a ``block_size`` forward argument (default 32, not read from ``config.bd_size``); we read
  ``bd_size`` and always pass the additive block mask.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, Qwen2Config, Qwen3Config

from dllm_rl.models.families.base import Family, ids, require, rope_theta

QWEN_KEYS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"]
QWEN_STRUCT = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
]


def qwen_common(pub: dict[str, Any]) -> dict[str, Any]:
    kw = {k: pub[k] for k in QWEN_STRUCT if k in pub}
    kw.setdefault("num_key_value_heads", pub["num_attention_heads"])
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": float(pub.get("rope_theta", 1e6))}
    for k in ("pad_token_id", "eos_token_id", "bos_token_id"):
        kw[k] = pub.get(k)
    kw["use_sliding_window"] = False
    return kw


def qwen_published(fam: Family, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
    pub = dict(base or {})
    pub.update({k: getattr(hf, k) for k in QWEN_STRUCT})
    pub.update(
        model_type=fam.model_type,
        architectures=list(fam.architectures),
        auto_map=dict(fam.auto_map),
        rope_theta=rope_theta(hf),
        hidden_act="silu",
        use_sliding_window=False,
    )
    pub.setdefault("mask_token_id", fam.mask_token_id)
    for k, v in (("eos_token_id", fam.eos_token_id), ("pad_token_id", fam.pad_token_id)):
        pub.setdefault(k, v)
    pub.setdefault("bos_token_id", pub["eos_token_id"])
    return pub


def qwen_tiny(fam: Family, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
              mask_token_id, eos_token_id, pad_token_id, max_position_embeddings, tie_word_embeddings, rope_theta,
              **_: Any) -> dict[str, Any]:
    mask, eos, pad = ids(fam, vocab_size, mask_token_id, eos_token_id, pad_token_id)
    return {
        "model_type": fam.model_type, "architectures": list(fam.architectures), "auto_map": dict(fam.auto_map),
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings, "rope_theta": rope_theta, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings, "mask_token_id": mask, "eos_token_id": eos,
        "pad_token_id": pad, "bos_token_id": eos, "hidden_act": "silu",
    }


class Dream(Family):
    """Qwen2 maths and names (also Fast-dLLM v2, which differs only in its attention rule and block key)."""

    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, QWEN_KEYS, self.name)
        return Qwen2Config(**qwen_common(pub))

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        return qwen_published(self, hf, base)

    def tiny(self, **kw: Any) -> dict[str, Any]:
        pub = qwen_tiny(self, **kw)
        if self.block_size_key:
            pub[self.block_size_key] = kw["block_size"]
        return pub


class SDAR(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, QWEN_KEYS, "sdar")
        kw = qwen_common(pub)
        kw["head_dim"] = int(pub.get("head_dim") or pub["hidden_size"] // pub["num_attention_heads"])
        kw["attention_bias"] = bool(pub.get("attention_bias", False))
        return Qwen3Config(**kw)

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = qwen_published(self, hf, base)
        pub["head_dim"] = hf.head_dim
        pub["attention_bias"] = bool(hf.attention_bias)
        pub.setdefault("block_size", self.block_size)
        return pub

    def tiny(self, **kw: Any) -> dict[str, Any]:
        pub = qwen_tiny(self, **kw)
        pub["head_dim"] = kw["hidden_size"] // kw["num_heads"]
        pub["block_size"] = kw["block_size"]
        return pub


DREAM = Dream(
    name="dream", attention="full", shift=True, mask_token_id=151666, eos_token_id=151643,
    pad_token_id=151643, model_type="Dream", architectures=("DreamModel",), mask_token="<|mask|>",
    block_size_key=None,
    auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
)
SDAR_FAMILY = SDAR(
    name="sdar", attention="block", shift=False, mask_token_id=151669, eos_token_id=151643,
    pad_token_id=151643, model_type="sdar", architectures=("SDARForCausalLM",), block_size=4,
    mask_token="<|MASK|>",
    auto_map={
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    },
)
# Fast-dLLM v2: mask id 151665 (<|mask|> in its Qwen2.5 tokenizer; absent from the published config.json).
FAST_DLLM_V2 = Dream(
    name="fast_dllm_v2", attention="block", shift=True, mask_token_id=151665, eos_token_id=151645,
    pad_token_id=151643, model_type="Fast_dLLM_Qwen", architectures=("Fast_dLLM_QwenForCausalLM",),
    block_size=32, block_size_key="bd_size", mask_token="<|mask|>",
    auto_map={
        "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
        "AutoModel": "modeling.Fast_dLLM_QwenModel",
        "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
    },
)
