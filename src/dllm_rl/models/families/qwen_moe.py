"""Qwen3-MoE-shaped families onto transformers' ``Qwen3MoeForCausalLM``.

* **SDAR-30B-A3B** (JetLM/SDAR-30B-A3B-Chat, ``SDARMoeForCausalLM``): Qwen3-MoE names and config keys
  exactly (softmax router, top-k, ``norm_topk_prob`` from the config, per-head q/k norm, explicit
  ``head_dim``), block-causal, block 4, mask id 151669. The published model passes its mask through
  ``.bool()`` (an additive mask there is inverted); we pass our additive block mask to HF.
* **LLaDA-MoE-7B-A1B** (inclusionAI/LLaDA-MoE-7B-A1B-*, ``LLaDAMoEModelLM``, ``model_type: llada`` like
  dense LLaDA, told apart by ``architectures``): OLMoE-derived code with Qwen3-MoE tensor names
  (``mlp.gate.weight``, ``mlp.experts.<j>.*``, ``self_attn.q_norm`` / ``k_norm`` per head before RoPE),
  bidirectional attention, mask id 156895. Its config keys differ: ``dense_intermediate_size``,
  ``expert_intermediate_size``, ``moe_layer_freq`` (0 = dense layer), ``qk_layernorm``. The published code
  hard-codes **no** top-k renormalisation whatever ``norm_topk_prob`` says (so ``norm_topk_prob: false``
  here) and its forward ignores attention masks (no padding support); ours masks padding.
  Refused (no Qwen3-MoE counterpart): shared experts, an expert bias, non-softmax router scores, partial
  RoPE, ``clip_qkv``, ``qk_layernorm: false``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig, Qwen3MoeConfig

from dllm_rl.models.families.base import Family, refuse, require
from dllm_rl.models.families.experts import fuse_experts, split_experts
from dllm_rl.models.families.qwen import QWEN_KEYS, qwen_common, qwen_published, qwen_tiny

_MOE_KEYS = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
             "decoder_sparse_step", "mlp_only_layers"]


class _QwenMoeState(Family):
    def to_hf_state(self, tensors: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        return fuse_experts(tensors, hf.num_experts)

    def to_published_state(self, state: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        return split_experts(state)


def _head_dim(pub: dict[str, Any]) -> int:
    return int(pub.get("head_dim") or pub["hidden_size"] // pub["num_attention_heads"])


class SDARMoe(_QwenMoeState):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, QWEN_KEYS + ["num_experts", "num_experts_per_tok", "moe_intermediate_size"], self.name)
        kw = qwen_common(pub)
        kw.update({k: pub[k] for k in _MOE_KEYS if k in pub})
        kw.update(head_dim=_head_dim(pub), attention_bias=bool(pub.get("attention_bias", False)))
        return Qwen3MoeConfig(**kw)

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = qwen_published(self, hf, base)
        pub.update({k: getattr(hf, k) for k in _MOE_KEYS})
        pub.update(head_dim=hf.head_dim, attention_bias=bool(hf.attention_bias))
        pub.setdefault("block_size", self.block_size)
        return pub

    def tiny(self, *, num_experts=4, experts_per_token=2, moe_intermediate_size=16, **kw: Any) -> dict[str, Any]:
        pub = qwen_tiny(self, **kw)
        pub.update(head_dim=kw["hidden_size"] // kw["num_heads"], block_size=kw["block_size"], num_experts=num_experts,
                   num_experts_per_tok=experts_per_token, moe_intermediate_size=moe_intermediate_size,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return pub


class LLaDAMoe(_QwenMoeState):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        keys = ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "num_experts",
                "num_experts_per_tok", "expert_intermediate_size"]
        require(pub, keys, self.name)
        self._refuse_unsupported(pub)
        kw = qwen_common(pub)
        layers = int(pub["num_hidden_layers"])
        freq = list(pub.get("moe_layer_freq") or [1] * layers)
        dense = [i for i, f in enumerate(freq) if not f]
        inter = pub.get("dense_intermediate_size")
        kw.update(
            head_dim=int(pub["hidden_size"]) // int(pub["num_attention_heads"]),
            intermediate_size=int(inter) if inter and int(inter) > 0 else int(pub["expert_intermediate_size"]),
            moe_intermediate_size=int(pub["expert_intermediate_size"]), num_experts=int(pub["num_experts"]),
            num_experts_per_tok=int(pub["num_experts_per_tok"]), norm_topk_prob=False, mlp_only_layers=dense,
            attention_bias=bool(pub.get("attention_bias", False)),
        )
        kw["rope_parameters"]["rope_theta"] = float(pub.get("rope_theta", 10000.0))
        return Qwen3MoeConfig(**kw)

    def _refuse_unsupported(self, pub: dict[str, Any]) -> None:
        if pub.get("shared_expert_intermediate_size") not in (None, 0, -1):
            refuse(self.name, "shared_expert_intermediate_size", pub["shared_expert_intermediate_size"],
                   "Qwen3-MoE has no shared expert")
        if pub.get("moe_router_enable_expert_bias"):
            refuse(self.name, "moe_router_enable_expert_bias", True, "Qwen3-MoE's router has no expert bias")
        if pub.get("moe_router_score_function") not in (None, "softmax"):
            refuse(self.name, "moe_router_score_function", pub["moe_router_score_function"], "Qwen3-MoE uses softmax")
        if pub.get("partial_rotary_factor") not in (None, -1, 1, 1.0):
            refuse(self.name, "partial_rotary_factor", pub["partial_rotary_factor"], "Qwen3-MoE rotates whole heads")
        if pub.get("clip_qkv") is not None:
            refuse(self.name, "clip_qkv", pub["clip_qkv"], "Qwen3-MoE does not clip q/k/v")
        if pub.get("qk_layernorm") is False:
            refuse(self.name, "qk_layernorm", False, "Qwen3-MoE always applies q/k norm")

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = qwen_published(self, hf, base)
        del pub["intermediate_size"]
        pub.update(
            dense_intermediate_size=hf.intermediate_size, expert_intermediate_size=hf.moe_intermediate_size,
            num_experts=hf.num_experts, num_experts_per_tok=hf.num_experts_per_tok, norm_topk_prob=False,
            moe_layer_freq=[0 if i in hf.mlp_only_layers else 1 for i in range(hf.num_hidden_layers)],
            qk_layernorm=True, attention_bias=bool(hf.attention_bias), partial_rotary_factor=1.0,
        )
        return pub

    def tiny(self, *, num_experts=4, experts_per_token=2, moe_intermediate_size=16, **kw: Any) -> dict[str, Any]:
        pub = qwen_tiny(self, **kw)
        pub["dense_intermediate_size"] = pub.pop("intermediate_size")
        pub.update(expert_intermediate_size=moe_intermediate_size, num_experts=num_experts,
                   num_experts_per_tok=experts_per_token, norm_topk_prob=False, qk_layernorm=True,
                   moe_layer_freq=[1] * kw["num_layers"], partial_rotary_factor=1.0,
                   shared_expert_intermediate_size=None, moe_router_enable_expert_bias=False,
                   moe_router_score_function="softmax")
        return pub

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("tie_word_embeddings", False))


SDAR_MOE = SDARMoe(
    name="sdar_moe", attention="block", shift=False, mask_token_id=151669, eos_token_id=151643,
    pad_token_id=151643, model_type="sdar_moe", architectures=("SDARMoeForCausalLM",), block_size=4,
    mask_token="<|MASK|>", moe=True,
    auto_map={
        "AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
        "AutoModel": "modeling_sdar_moe.SDARMoeModel",
        "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM",
    },
)
LLADA_MOE = LLaDAMoe(
    name="llada_moe", attention="full", shift=False, mask_token_id=156895, eos_token_id=156892,
    pad_token_id=156892, model_type="llada", architectures=("LLaDAMoEModelLM",), mask_token="<|mask|>",
    block_size_key=None, moe=True,
    auto_map={
        "AutoConfig": "configuration_lladamoe.LLaDAMoEConfig",
        "AutoModel": "modeling_lladamoe.LLaDAMoEModel",
        "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM",
    },
)
