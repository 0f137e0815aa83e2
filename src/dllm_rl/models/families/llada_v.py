"""LLaDA-V (GSAI-ML/LLaDA-V): LLaVA-OneVision mechanics over a bidirectional Llama-shaped LLaDA.

Facts read from the published code (Gen-Verse/dLLM-RL, ``sample/llava`` and ``models/lladav``):

- ``architectures: [LlavaLLaDAModelLM]``, ``model_type: llava_llada``; a Llama-style config (``hidden_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
  ``rms_norm_eps`` (class default 1e-6), ``rope_theta``, ``attention_bias``) plus LLaVA keys
  (``mm_hidden_size``, ``mm_projector_type``, ``mm_patch_merge_type``, ``image_aspect_ratio``,
  ``image_grid_pinpoints``, ``mm_vision_tower``).
- Language model: HF Llama tensor names (``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
  ``mlp.{gate,up,down}_proj``, ``model.norm``), untied ``lm_head``, head dim ``hidden / heads``, attention never
  causal (the image and the whole prompt are attended both ways).
- Vision: a SigLIP vision model at ``model.vision_tower.vision_tower.vision_model.*`` whose last encoder layer
  was deleted before saving and whose pooling head is gone; the features are the shortened encoder's last
  hidden state, **without** ``post_layernorm`` (its weights are saved, never used). The tower's shape is not
  in the published config (the published code reads it from the SigLIP checkpoint ``mm_vision_tower`` names:
  google/siglip2-so400m-patch14-384). Our key ``vision_config`` (that SigLIP config, before the deletion) says
  it for other shapes; without it the so400m shape below applies.
- Projector ``mlp2x_gelu`` at ``model.mm_projector.{0,2}`` (Linear, exact GELU, Linear, with biases);
  ``model.image_newline`` [H] (``spatial_unpad``).

How our :class:`~dllm_rl.models.diffusion_lm.DiffusionLM` holds it: a stock
``LlavaOnevisionForConditionalGeneration`` (SigLIP vision model + 2-layer GELU projector + ``image_newline``
+ Llama text model) with ``vision_feature_layer=-1`` over the shortened tower and ``vision_feature_select_strategy
= "full"``. Its tensors are the published ones under other names, its ``pack_image_features`` reproduces the
published anyres / newline packing, and one module keeps what the library relies on working unchanged: one
``state_dict`` to save, one ``forward`` for DDP / FSDP / PEFT, ``logits_to_keep``, and the additive 4D mask
that makes the Llama text model bidirectional (as for ``llada``). The image path itself (preprocessing,
features, the prompt splice) is :mod:`dllm_rl.models.llava_images`.

Training adapts the language model: ``lora_scope`` keeps LoRA's default targets out of SigLIP (whose attention
also has ``q/k/v_proj``) and the projector. The published LLaVA trainer means the same (``train/llava/train/
train.py``'s ``find_all_linear_names`` skips ``vision_tower`` and ``mm_projector``), but it hands peft bare
suffixes, which also match SigLIP's ``q/k/v_proj``; a scope says it exactly. Under FSDP2 each SigLIP encoder
layer and the projector are units of their own (``fsdp_units``), beside the Llama decoder layers that the
launch config names: the 400M-parameter tower is then gathered one layer at a time, not with the root.
"""

from __future__ import annotations

import re
from typing import Any

from transformers import (
    AutoModelForImageTextToText,
    LlamaConfig,
    LlavaOnevisionConfig,
    PretrainedConfig,
    SiglipVisionConfig,
)

from dllm_rl.errors import UserError
from dllm_rl.models.families.base import Family, ids, refuse, require, rope_theta

# google/siglip2-so400m-patch14-384's vision tower, the one LLaDA-V was trained with (27 layers before the
# deletion); the published code hard-codes the same numbers in its own SigLIP config class.
SO400M_VISION = {
    "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_channels": 3, "image_size": 384, "patch_size": 14, "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
# Published training setting: 1x1 .. 6x6 tiles of the tower's image size.
DEFAULT_PINPOINTS = "(1x1),...,(6x6)"

_VISION_PUB, _VISION_HF = "model.vision_tower.vision_tower.vision_model.", "model.vision_tower."
_PROJ_PUB = {"model.mm_projector.0.": "model.multi_modal_projector.linear_1.",
             "model.mm_projector.2.": "model.multi_modal_projector.linear_2."}
_PROJ_HF = {v: k for k, v in _PROJ_PUB.items()}
_TEXT_PUB, _TEXT_HF = "model.", "model.language_model."
_SAME = ("model.image_newline", "lm_head.weight")
# Text keys written back from the HF config on save (only where the value changed).
_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "attention_bias")


def vision_config(pub: dict[str, Any]) -> dict[str, Any]:
    """The SigLIP config of the tower ``mm_vision_tower`` names, before LLaDA-V deleted its last layer."""
    cfg = dict(SO400M_VISION)
    cfg.update(pub.get("vision_config") or {})
    return cfg


def grid_pinpoints(pub: dict[str, Any]) -> list[list[int]]:
    """The anyres candidate resolutions as transformers wants them, ``[height, width]`` pairs in the published
    order (the published code reads its pairs as (width, height); keeping the order keeps its tie-breaks).

    ``"(1x1),...,(6x6)"`` spans every grid from the first to the last, in tiles of the tower's image size;
    a list is taken as published ``[width, height]`` pairs."""
    value = pub.get("image_grid_pinpoints") or DEFAULT_PINPOINTS
    tile = int(vision_config(pub)["image_size"])
    if isinstance(value, str):
        found = re.findall(r"\((\d+)x(\d+)\)", value)
        if not found:
            raise UserError(f"llada_v config.json: image_grid_pinpoints={value!r} is not of the form "
                            "'(1x1),...,(6x6)' or a list of [width, height] pairs")
        (w0, h0), (w1, h1) = (tuple(map(int, found[0])), tuple(map(int, found[-1])))
        pairs = [(w * tile, h * tile) for w in range(w0, w1 + 1) for h in range(h0, h1 + 1)]
    else:
        pairs = [(int(w), int(h)) for w, h in value]
    return [[h, w] for w, h in pairs]


def aspect_ratio(pub: dict[str, Any]) -> str:
    """``image_aspect_ratio``: ``pad`` or ``anyres_max_N`` (the two LLaDA-V uses)."""
    value = str(pub.get("image_aspect_ratio", "anyres_max_4"))
    if value != "pad" and not re.fullmatch(r"anyres_max_\d+", value):
        refuse("llada_v", "image_aspect_ratio", value, "LLaDA-V uses 'pad' or 'anyres_max_N'")
    return value


class LLaDAV(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"],
                "llada_v")
        self._check(pub)
        hidden, heads = int(pub["hidden_size"]), int(pub["num_attention_heads"])
        text = LlamaConfig(
            vocab_size=int(pub["vocab_size"]), hidden_size=hidden, intermediate_size=int(pub["intermediate_size"]),
            num_hidden_layers=int(pub["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(pub.get("num_key_value_heads") or heads), head_dim=hidden // heads,
            hidden_act=str(pub.get("hidden_act", "silu")),
            max_position_embeddings=int(pub.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(pub.get("rms_norm_eps", 1e-6)),
            rope_parameters={"rope_type": "default", "rope_theta": float(pub.get("rope_theta", 10000.0))},
            attention_bias=bool(pub.get("attention_bias", False)), mlp_bias=False, tie_word_embeddings=False,
            pad_token_id=pub.get("pad_token_id"), eos_token_id=pub.get("eos_token_id"),
            bos_token_id=pub.get("bos_token_id"),
        )
        tower = vision_config(pub)
        vision = SiglipVisionConfig(**{**tower, "num_hidden_layers": int(tower["num_hidden_layers"]) - 1},
                                    vision_use_head=False)
        ratio = aspect_ratio(pub)
        return LlavaOnevisionConfig(
            text_config=text, vision_config=vision, vision_feature_layer=-1, vision_feature_select_strategy="full",
            image_grid_pinpoints=grid_pinpoints(pub), projector_hidden_act="gelu", multimodal_projector_bias=True,
            vision_aspect_ratio=ratio if ratio != "pad" else "anyres_max_9", tie_word_embeddings=False,
        )

    @staticmethod
    def _check(pub: dict[str, Any]) -> None:
        """Refuse the published options this adapter does not map (each names its key)."""
        if pub.get("rope_scaling"):
            refuse("llada_v", "rope_scaling", pub["rope_scaling"], "LLaDA-V uses plain RoPE")
        if pub.get("tie_word_embeddings"):
            refuse("llada_v", "tie_word_embeddings", True, "LLaDA-V has an untied lm_head")
        if pub.get("mm_projector_type", "mlp2x_gelu") != "mlp2x_gelu":
            refuse("llada_v", "mm_projector_type", pub["mm_projector_type"], "LLaDA-V uses 'mlp2x_gelu'")
        if pub.get("mm_patch_merge_type", "spatial_unpad") != "spatial_unpad":
            refuse("llada_v", "mm_patch_merge_type", pub["mm_patch_merge_type"], "LLaDA-V uses 'spatial_unpad'")
        tower = vision_config(pub)
        if "mm_hidden_size" in pub and int(pub["mm_hidden_size"]) != int(tower["hidden_size"]):
            raise UserError(f"llada_v config.json: mm_hidden_size={pub['mm_hidden_size']} differs from the vision "
                            f"tower's hidden_size {tower['hidden_size']}; set vision_config to the SigLIP config of "
                            "the tower in mm_vision_tower")
        aspect_ratio(pub)

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        pub = dict(base or {})
        text = hf.get_text_config()
        values = {k: getattr(text, k) for k in _TEXT_KEYS}
        values["rope_theta"] = rope_theta(text)
        for key, value in values.items():
            if pub.get(key) != value:
                pub[key] = value
        pub.update(model_type=self.model_type, architectures=list(self.architectures))
        return pub

    def tiny(self, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
             mask_token_id, eos_token_id, pad_token_id, max_position_embeddings, tie_word_embeddings, rope_theta,
             **_: Any) -> dict[str, Any]:
        """A small LLaDA-V config; the vision tower keeps the published 384 px / patch 14 geometry (729
        patches, which the published code asserts) at width 16, 3 layers (2 kept)."""
        mask, eos, pad = ids(self, vocab_size, mask_token_id, eos_token_id, pad_token_id)
        tower = {**SO400M_VISION, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3,
                 "num_attention_heads": 2}
        return {
            "model_type": self.model_type, "architectures": list(self.architectures), "vocab_size": vocab_size,
            "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "hidden_act": "silu",
            "max_position_embeddings": max_position_embeddings, "rms_norm_eps": 1e-5, "rope_theta": rope_theta,
            "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": tie_word_embeddings,
            "mask_token_id": mask, "eos_token_id": eos, "pad_token_id": pad, "bos_token_id": 0,
            "mm_vision_tower": "google/siglip2-so400m-patch14-384", "mm_hidden_size": tower["hidden_size"],
            "mm_projector_type": "mlp2x_gelu", "mm_patch_merge_type": "spatial_unpad",
            "image_aspect_ratio": "anyres_max_4", "image_grid_pinpoints": DEFAULT_PINPOINTS,
            "vision_config": tower,
        }

    def to_hf_name(self, name: str) -> str:
        if name in _SAME:
            return name
        if name.startswith(_VISION_PUB):
            return _VISION_HF + name[len(_VISION_PUB):]
        for pub, hf in _PROJ_PUB.items():
            if name.startswith(pub):
                return hf + name[len(pub):]
        if name.startswith(_TEXT_PUB) and not name.startswith(("model.vision_tower.", "model.mm_projector.")):
            return _TEXT_HF + name[len(_TEXT_PUB):]
        raise UserError(f"llada_v: unexpected tensor name {name!r}")

    def to_published_name(self, name: str) -> str:
        if name in _SAME:
            return name
        if name.startswith(_VISION_HF):
            return _VISION_PUB + name[len(_VISION_HF):]
        for hf, pub in _PROJ_HF.items():
            if name.startswith(hf):
                return pub + name[len(hf):]
        if name.startswith(_TEXT_HF):
            return _TEXT_PUB + name[len(_TEXT_HF):]
        raise UserError(f"llada_v: no published name for {name!r}")

    def tied(self, pub: dict[str, Any]) -> bool:
        return False


LLADA_V = LLaDAV(
    name="llada_v", attention="full", shift=False, mask_token_id=126336, eos_token_id=126348, pad_token_id=126081,
    model_type="llava_llada", architectures=("LlavaLLaDAModelLM",), mask_token="<|mdm_mask|>",
    hf_auto_class=AutoModelForImageTextToText, lora_scope="model.language_model",
    fsdp_units=("SiglipEncoderLayer", "LlavaOnevisionMultiModalProjector"),
)
