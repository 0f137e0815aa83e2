"""Model families: published checkpoint layouts mapped onto stock transformers architectures.

A family is small: it reads a published ``config.json`` into a stock HF config, renames tensors in both
directions, and declares the mask id, the logit shift and the attention rule. No modeling code is copied;
the maths is HF's Llama / Qwen2 / Qwen3 (see ``shared/LAYOUTS.md`` for the layout facts).

| family | published | stock class | attention | mask id | logits |
|--------|-----------|-------------|-----------|---------|--------|
| llada  | GSAI-ML/LLaDA-8B-Instruct | LlamaForCausalLM | full | 126336 | same position |
| dream  | Dream-org/Dream-v0-Instruct-7B, apple/DiffuCoder | Qwen2ForCausalLM | full | 151666 | shifted by one |
| sdar   | JetLM/SDAR-*-Chat, Gen-Verse/TraDo | Qwen3ForCausalLM | block-causal | 151669 | same position |
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import LlamaConfig, PretrainedConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config

from dllm_rl.errors import UserError


@dataclass(frozen=True)
class Family:
    """What the rest of the library needs to know about one published layout."""

    name: str
    attention: str  # "full" (bidirectional) or "block" (block-causal)
    shift: bool  # True when raw logits at i score token i+1 (Dream)
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    model_type: str
    architectures: tuple[str, ...]
    auto_map: dict[str, str] = field(default_factory=dict)
    block_size: int | None = None
    mask_token: str | None = None  # the mask token's text in the published tokenizer
    # LoRA targets, in HF module names (what peft sees).
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    # -- config ---------------------------------------------------------------------------------
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        """The stock transformers config for a published ``config.json`` dict."""
        raise NotImplementedError

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        """The published ``config.json`` dict for ``hf``, keeping any unknown keys of ``base``."""
        raise NotImplementedError

    # -- tensor names ---------------------------------------------------------------------------
    def to_hf_name(self, name: str) -> str:
        return name

    def to_published_name(self, name: str) -> str:
        return name

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("tie_word_embeddings", False))


def _rope_theta(hf: PretrainedConfig) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def _require(pub: dict[str, Any], keys: list[str], family: str) -> None:
    missing = [k for k in keys if k not in pub]
    if missing:
        raise UserError(f"{family} config.json is missing required keys: {', '.join(missing)}")


# --------------------------------------------------------------------------------------------------
# LLaDA: OLMo-style names, Llama maths.
_LLADA_BLOCK = {
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
_LLADA_BLOCK_INV = {v: k for k, v in _LLADA_BLOCK.items()}
_LLADA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
_LLADA_TOP_INV = {v: k for k, v in _LLADA_TOP.items()}


class _LLaDA(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        _require(pub, ["d_model", "n_heads", "n_layers", "vocab_size"], "llada")
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
            rope_theta=_rope_theta(hf),
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

    def to_hf_name(self, name: str) -> str:
        if name in _LLADA_TOP:
            return _LLADA_TOP[name]
        m = re.fullmatch(r"model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)", name)
        if m and m.group(2) in _LLADA_BLOCK:
            return f"model.layers.{m.group(1)}.{_LLADA_BLOCK[m.group(2)]}.{m.group(3)}"
        raise UserError(f"llada: unexpected tensor name {name!r}")

    def to_published_name(self, name: str) -> str:
        if name in _LLADA_TOP_INV:
            return _LLADA_TOP_INV[name]
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
        if m and m.group(2) in _LLADA_BLOCK_INV:
            return f"model.transformer.blocks.{m.group(1)}.{_LLADA_BLOCK_INV[m.group(2)]}.{m.group(3)}"
        raise UserError(f"llada: no published name for {name!r}")

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("weight_tying", False))


# --------------------------------------------------------------------------------------------------
# Dream / DiffuCoder (Qwen2 names) and SDAR / TraDo (Qwen3 names): tensor names are already HF's.
_QWEN_KEYS = ["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"]
_QWEN_STRUCT = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
]


def _qwen_common(pub: dict[str, Any]) -> dict[str, Any]:
    kw = {k: pub[k] for k in _QWEN_STRUCT if k in pub}
    kw.setdefault("num_key_value_heads", pub["num_attention_heads"])
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": float(pub.get("rope_theta", 1e6))}
    for k in ("pad_token_id", "eos_token_id", "bos_token_id"):
        kw[k] = pub.get(k)
    kw["use_sliding_window"] = False
    return kw


def _qwen_published(fam: Family, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
    pub = dict(base or {})
    pub.update({k: getattr(hf, k) for k in _QWEN_STRUCT})
    pub.update(
        model_type=fam.model_type,
        architectures=list(fam.architectures),
        auto_map=dict(fam.auto_map),
        rope_theta=_rope_theta(hf),
        hidden_act="silu",
        use_sliding_window=False,
    )
    pub.setdefault("mask_token_id", fam.mask_token_id)
    for k, v in (("eos_token_id", fam.eos_token_id), ("pad_token_id", fam.pad_token_id)):
        pub.setdefault(k, v)
    pub.setdefault("bos_token_id", pub["eos_token_id"])
    return pub


class _Dream(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        _require(pub, _QWEN_KEYS, "dream")
        return Qwen2Config(**_qwen_common(pub))

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        return _qwen_published(self, hf, base)


class _SDAR(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        _require(pub, _QWEN_KEYS, "sdar")
        kw = _qwen_common(pub)
        kw["head_dim"] = int(pub.get("head_dim") or pub["hidden_size"] // pub["num_attention_heads"])
        kw["attention_bias"] = bool(pub.get("attention_bias", False))
        return Qwen3Config(**kw)

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = _qwen_published(self, hf, base)
        pub["head_dim"] = hf.head_dim
        pub["attention_bias"] = bool(hf.attention_bias)
        pub.setdefault("block_size", self.block_size)
        return pub


FAMILIES: dict[str, Family] = {
    "llada": _LLaDA(
        name="llada", attention="full", shift=False, mask_token_id=126336, eos_token_id=126081,
        pad_token_id=126081, model_type="llada", architectures=("LLaDAModelLM",), mask_token="<|mdm_mask|>",
        auto_map={
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
    ),
    "dream": _Dream(
        name="dream", attention="full", shift=True, mask_token_id=151666, eos_token_id=151643,
        pad_token_id=151643, model_type="Dream", architectures=("DreamModel",), mask_token="<|mask|>",
        auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    ),
    "sdar": _SDAR(
        name="sdar", attention="block", shift=False, mask_token_id=151669, eos_token_id=151643,
        pad_token_id=151643, model_type="sdar", architectures=("SDARForCausalLM",), block_size=4,
        mask_token="<|MASK|>",
        auto_map={
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
    ),
}


def get_family(name: str) -> Family:
    """The family called ``name`` (case-insensitive); a clear error lists the supported ones."""
    fam = FAMILIES.get(name.lower())
    if fam is None:
        raise UserError(f"unknown model family {name!r}; supported: {', '.join(FAMILIES)}")
    return fam


def detect_family(pub: dict[str, Any], source: str = "config.json") -> Family:
    """Find the family of a published config from ``model_type``, ``architectures`` or ``auto_map``."""
    hints = [str(pub.get("model_type", ""))] + [str(a) for a in pub.get("architectures") or []]
    hints += [str(v) for v in (pub.get("auto_map") or {}).values()]
    for hint in hints:
        low = hint.lower()
        for name in FAMILIES:
            if low == name or low.startswith(name) or f"_{name}" in low or f".{name}" in low:
                return FAMILIES[name]
    raise UserError(
        f"{source}: cannot tell the model family from model_type={pub.get('model_type')!r}, "
        f"architectures={pub.get('architectures')!r}; supported families: {', '.join(FAMILIES)}"
    )


def _tokenizer_mask_id(tokenizer_dir: str | Path, fam: Family) -> int | None:
    """The mask id of the tokenizer in ``tokenizer_dir``: its mask token, else the family's mask token text
    in its vocabulary (None: no tokenizer there, or no mask token in it)."""
    if not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        return None
    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    found = tok.get_vocab().get(fam.mask_token) if fam.mask_token else None
    return None if found is None else int(found)


def resolve_mask_token_id(pub: dict[str, Any], fam: Family, source: str | Path,
                          tokenizer_dir: str | Path | None = None) -> int:
    """The mask id of a published config: its ``mask_token_id``; else (configs of several published
    families lack it, see LAYOUTS.md) the tokenizer's mask token; else the family's published id. An id
    outside the embedding (``vocab_size`` rows) is refused, naming ``source`` (the config.json)."""
    if "mask_token_id" in pub:
        mask_id, origin = int(pub["mask_token_id"]), f"{source}: mask_token_id {pub['mask_token_id']}"
    else:
        found = _tokenizer_mask_id(tokenizer_dir, fam) if tokenizer_dir is not None else None
        if found is not None:
            mask_id, origin = found, f"{source} has no mask_token_id, and the mask token of {tokenizer_dir} ({found})"
        else:
            mask_id = fam.mask_token_id
            origin = (f"{source} has no mask_token_id, {tokenizer_dir or 'the tokenizer'} has no mask token, and "
                      f"the {fam.name} default ({mask_id})")
    vocab = int(fam.hf_config(pub).vocab_size)
    if not 0 <= mask_id < vocab:
        raise UserError(f"{origin} is outside the vocabulary (vocab_size {vocab}); set mask_token_id in {source} "
                        "to the id of the mask token")
    return mask_id


def tiny_config(
    family: str,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    block_size: int = 4,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    rope_theta: float = 10000.0,
) -> dict[str, Any]:
    """A small published-layout ``config.json`` dict of ``family``'s shape, for tests and demos.

    Token ids default to the last ids of the vocabulary (mask = V-1, eos = pad = V-2).
    """
    fam = get_family(family)
    mask = vocab_size - 1 if mask_token_id is None else mask_token_id
    eos = vocab_size - 2 if eos_token_id is None else eos_token_id
    pad = eos if pad_token_id is None else pad_token_id
    if fam.name == "llada":
        return {
            "model_type": fam.model_type, "architectures": list(fam.architectures), "auto_map": dict(fam.auto_map),
            "d_model": hidden_size, "n_heads": num_heads, "n_kv_heads": num_kv_heads, "n_layers": num_layers,
            "mlp_hidden_size": intermediate_size, "vocab_size": vocab_size, "embedding_size": vocab_size,
            "max_sequence_length": max_position_embeddings, "rope_theta": rope_theta, "rms_norm_eps": 1e-5,
            "weight_tying": tie_word_embeddings, "mask_token_id": mask, "eos_token_id": eos,
            "pad_token_id": pad, "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu",
        }
    pub = {
        "model_type": fam.model_type, "architectures": list(fam.architectures), "auto_map": dict(fam.auto_map),
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings, "rope_theta": rope_theta, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings, "mask_token_id": mask, "eos_token_id": eos,
        "pad_token_id": pad, "bos_token_id": eos, "hidden_act": "silu",
    }
    if fam.name == "sdar":
        pub["head_dim"] = hidden_size // num_heads
        pub["block_size"] = block_size
    return pub
