"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini 16B-A1B, -flash 100B-A6B; ``LLaDA2MoeModelLM``,
``model_type: llada2_moe``) onto transformers' ``Glm4MoeForCausalLM`` through its ``SarvamMoEConfig``
(a BailingMoeV2-layout alias).

Facts read from the published ``modeling_llada2_moe.py`` / ``configuration_llada2_moe.py``:

* names: ``model.word_embeddings``, ``attention.query_key_value`` (fused rows ``[q | k | v]``, GQA),
  ``attention.query_layernorm`` / ``key_layernorm`` (per-head RMSNorm before RoPE), ``attention.dense``,
  ``mlp.gate.weight`` + ``mlp.gate.expert_bias``, ``mlp.experts.<j>.*``, ``mlp.shared_experts.*``; the first
  ``first_k_dense_replace`` layers have a dense ``mlp.{gate,up,down}_proj`` of ``intermediate_size``;
* routing: sigmoid scores; the expert bias is added for the *choice* only; groups scored by the sum of
  their top-2 biased scores, ``topk_group`` groups kept, top-k experts among them; weights are the
  unbiased scores of the chosen experts, renormalised (when top-k > 1) and scaled by
  ``routed_scaling_factor``; shared experts added to the routed output. Glm4Moe's router does exactly
  this with ``norm_topk_prob = top_k > 1``;
* RoPE on the first ``partial_rotary_factor`` (0.5) of each head, ``head_dim`` explicit; q/k norm on
  (the class default; the published config.json has no ``use_qk_norm``);
* the published model accepts only a 4D ``(B, 1, T, T)`` mask (an older revision fell back to causal on
  a 2D one): the adapter always passes the additive 4D mask;
* no block size in config.json: block 32 is a sampler setting (the family default here; a ``block_size``
  key, which the published code ignores, overrides it and is written back when it differs from 32);
* no ``mask_token_id`` in config.json: 156895 (``<|mask|>``).

Not confirmed against a published config.json (none is readable here): the values of ``use_bias`` and
``norm_head`` in the released checkpoints; the adapter refuses ``use_bias`` / ``norm_head`` true (Glm4Moe
has no attention-output bias and no normalised head) rather than load them wrong.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import PretrainedConfig, SarvamMoEConfig

from dllm_rl.errors import UserError
from dllm_rl.models.families.base import Family, ids, refuse, require, rope_theta
from dllm_rl.models.families.experts import fuse_experts, split_experts

_KEYS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
         "num_experts", "num_experts_per_tok", "moe_intermediate_size"]
_RENAMES = [  # (published, HF) name pieces; each occurs once in a name
    ("model.word_embeddings.", "model.embed_tokens."),
    (".attention.dense.", ".self_attn.o_proj."),
    (".attention.query_layernorm.", ".self_attn.q_norm."),
    (".attention.key_layernorm.", ".self_attn.k_norm."),
    (".mlp.gate.expert_bias", ".mlp.gate.e_score_correction_bias"),
]


def _rename(name: str, forward: bool) -> str:
    for pub, hf in _RENAMES:
        src, dst = (pub, hf) if forward else (hf, pub)
        if src in name:
            return name.replace(src, dst)
    return name


class LLaDA2(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, _KEYS, self.name)
        for key in ("use_bias", "norm_head"):
            if pub.get(key, key == "use_bias"):  # the published class defaults use_bias to True
                refuse(self.name, key, pub.get(key, True), "Glm4Moe has no attention-output bias / normalised head")
        shared = pub.get("num_shared_experts")
        if not shared:
            refuse(self.name, "num_shared_experts", shared, "Glm4Moe always adds shared experts")
        hidden, heads = int(pub["hidden_size"]), int(pub["num_attention_heads"])
        top_k = int(pub["num_experts_per_tok"])
        return SarvamMoEConfig(
            vocab_size=int(pub["vocab_size"]), hidden_size=hidden, intermediate_size=int(pub["intermediate_size"]),
            num_hidden_layers=int(pub["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(pub.get("num_key_value_heads") or heads),
            head_dim=int(pub.get("head_dim") or hidden // heads),
            partial_rotary_factor=float(pub.get("partial_rotary_factor", 0.5)),
            rope_parameters={"rope_type": "default", "rope_theta": float(pub.get("rope_theta", 10000.0))},
            max_position_embeddings=int(pub.get("max_position_embeddings", 16384)),
            rms_norm_eps=float(pub.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(pub.get("tie_word_embeddings")),
            attention_bias=bool(pub.get("use_qkv_bias", False)), use_qk_norm=True,
            n_routed_experts=int(pub["num_experts"]), num_experts_per_tok=top_k, n_shared_experts=int(shared),
            moe_intermediate_size=int(pub["moe_intermediate_size"]), n_group=int(pub.get("n_group", 8)),
            topk_group=int(pub.get("topk_group", 4)),
            routed_scaling_factor=float(pub.get("routed_scaling_factor", 2.5)),
            first_k_dense_replace=int(pub.get("first_k_dense_replace", 0)), norm_topk_prob=top_k > 1,
            pad_token_id=pub.get("pad_token_id"), eos_token_id=pub.get("eos_token_id"),
            bos_token_id=pub.get("bos_token_id"),
        )

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = dict(base or {})
        pub.update(
            model_type=self.model_type, architectures=list(self.architectures), auto_map=dict(self.auto_map),
            vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers, num_attention_heads=hf.num_attention_heads,
            num_key_value_heads=hf.num_key_value_heads, head_dim=hf.head_dim,
            partial_rotary_factor=float(hf.rope_parameters.get("partial_rotary_factor", 1.0)),
            rope_theta=rope_theta(hf), max_position_embeddings=hf.max_position_embeddings,
            rms_norm_eps=hf.rms_norm_eps, tie_word_embeddings=bool(hf.tie_word_embeddings),
            use_qkv_bias=bool(hf.attention_bias), use_bias=False, norm_head=False, hidden_act="silu",
            num_experts=hf.n_routed_experts, num_experts_per_tok=hf.num_experts_per_tok,
            num_shared_experts=hf.n_shared_experts, moe_intermediate_size=hf.moe_intermediate_size,
            n_group=hf.n_group, topk_group=hf.topk_group, routed_scaling_factor=hf.routed_scaling_factor,
            first_k_dense_replace=hf.first_k_dense_replace,
        )
        pub.setdefault("eos_token_id", self.eos_token_id)
        pub.setdefault("pad_token_id", self.pad_token_id)
        return pub

    def tiny(self, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
             mask_token_id, eos_token_id, pad_token_id, max_position_embeddings, tie_word_embeddings, rope_theta,
             block_size, num_experts=4, experts_per_token=2, moe_intermediate_size=16, **_: Any) -> dict[str, Any]:
        mask, eos, pad = ids(self, vocab_size, mask_token_id, eos_token_id, pad_token_id)
        return {
            "model_type": self.model_type, "architectures": list(self.architectures), "auto_map": dict(self.auto_map),
            "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
            "head_dim": hidden_size // num_heads, "partial_rotary_factor": 0.5, "rope_theta": rope_theta,
            "max_position_embeddings": max_position_embeddings, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": tie_word_embeddings, "use_qkv_bias": False, "use_bias": False, "norm_head": False,
            "hidden_act": "silu", "num_experts": num_experts, "num_experts_per_tok": experts_per_token,
            "num_shared_experts": 1, "moe_intermediate_size": moe_intermediate_size, "n_group": 2, "topk_group": 1,
            "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "mask_token_id": mask, "eos_token_id": eos,
            "pad_token_id": pad, "block_size": block_size,
        }

    def to_hf_state(self, tensors: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        q = hf.num_attention_heads * hf.head_dim
        kv = hf.num_key_value_heads * hf.head_dim
        out: dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            if ".attention.query_key_value." in name:
                if t.shape[0] != q + 2 * kv:
                    raise UserError(f"tensor {name!r} has {t.shape[0]} rows; config.json implies {q + 2 * kv} "
                                    f"((num_attention_heads + 2 * num_key_value_heads) * head_dim)")
                for part, piece in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv], dim=0), strict=True):
                    out[name.replace("attention.query_key_value", f"self_attn.{part}")] = piece
            else:
                out[_rename(name, True)] = t
        return fuse_experts(out, hf.n_routed_experts)

    def to_published_state(self, state: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, t in split_experts(state).items():
            m = re.fullmatch(r"(.+)\.self_attn\.q_proj\.(weight|bias)", name)
            if m:
                parts = [state[f"{m[1]}.self_attn.{p}.{m[2]}"] for p in ("q_proj", "k_proj", "v_proj")]
                out[f"{m[1]}.attention.query_key_value.{m[2]}"] = torch.cat(parts, dim=0)
            elif re.search(r"\.self_attn\.[kv]_proj\.", name):
                continue
            else:
                out[_rename(name, False)] = t
        return out


LLADA2 = LLaDA2(
    name="llada2", attention="block", shift=False, mask_token_id=156895, eos_token_id=156892,
    pad_token_id=156892, model_type="llada2_moe", architectures=("LLaDA2MoeModelLM",), block_size=32,
    mask_token="<|mask|>", moe=True,
    auto_map={
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
    },
)
