"""DiffusionGemma (google/diffusiongemma-26B-A4B-it) onto transformers' ``DiffusionGemmaForBlockDiffusion``.

Facts read from the stock transformers code (``models/diffusion_gemma``, 5.2x) and checked on tiny models by
``tests/models/test_models_diffusion_gemma.py``:

- **Uniform-state diffusion, no mask token**: a canvas starts as uniformly random ids and the tokens a step does
  not accept are re-noised to fresh random ids (``Family.noise == "uniform"``; its sampler is
  :mod:`dllm_rl.sampling.uniform`).
- ``architectures: [DiffusionGemmaForBlockDiffusion]``, ``model_type: diffusion_gemma``; the published config is
  transformers' own: a ``text_config`` (``diffusion_gemma_text``: Gemma-4 layers, sliding and full attention by
  ``layer_types``, MoE by ``num_experts`` / ``top_k_experts`` / ``moe_intermediate_size`` beside a dense MLP,
  final logit soft-capping 30), a Gemma-4 ``vision_config`` (the stock class always builds the vision tower; it is
  kept as published), ``canvas_length`` (the block, 256) and image token ids.
- Tensor names are HF's as they are (the stock class declares no checkpoint conversion mapping). Two stacks share
  their weights: the causal encoder (``model.encoder.language_model.*``, which fills the KV cache with the prompt
  and every finished canvas) and the bidirectional decoder (``model.decoder.*``, which reads a canvas against that
  cache and adds ``self_conditioning``). Under ``tie_word_embeddings`` (published: true) every encoder text weight is
  tied to its decoder twin and ``lm_head`` to the decoder embedding (the stock ``_tied_weights_keys``), and the
  checkpoint holds the decoder's copy only; buffers (``layer_scalar``) are not tied and are stored for both stacks.
  A checkpoint that also stores the tied copies loads too; we save them once, as ``save_pretrained`` does.
- Gemma's ids: pad 0, eos 1, bos 2 (in ``text_config``).

LoRA targets both text stacks (``lora_scope``: the decoder, self-conditioning included, and the encoder's language
model; the Gemma-4 vision tower also has ``q/k/v_proj`` and stays frozen). The encoder's layers are other modules over
the same tied weights, so peft wraps each twin apart; :func:`dllm_rl.models.lora_twins.tie_lora_twins` then ties the
encoder twin's LoRA A/B to the decoder's, as the base weights are tied: one adapter, seen by both stacks, saved under
both names (peft's ``save_pretrained`` stores the aliases as copies) and tied again on load. Untied checkpoints
(``tie_word_embeddings: false``) get an adapter per stack.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, DiffusionGemmaConfig, PretrainedConfig
from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaModel

from dllm_rl.models.families.base import Family, require

_ENCODER, _DECODER = "model.encoder.language_model.", "model.decoder."
# Keys of our own that a loaded published dict may carry and the stock config does not take.
_OURS = ("mask_token_id",)


def _is_tied(name: str) -> bool:
    """Whether encoder tensor ``name`` (a full HF name) is tied to its decoder twin: the stock model's own
    ``_tied_weights_keys`` patterns (relative to ``DiffusionGemmaModel``), read rather than restated."""
    inner = name.removeprefix("model.")
    return any(re.fullmatch(pattern, inner) for pattern in DiffusionGemmaModel._tied_weights_keys)


class DiffusionGemma(Family):
    def hf_config(self, pub: dict[str, Any]) -> PretrainedConfig:
        require(pub, ["text_config"], self.name)
        require(pub["text_config"], ["vocab_size", "hidden_size", "num_hidden_layers"], f"{self.name} text_config")
        return DiffusionGemmaConfig.from_dict({k: v for k, v in pub.items() if k not in _OURS})

    def published_config(self, hf: PretrainedConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        """What ``save_pretrained`` writes for ``hf`` (its non-default keys), plus any other key of ``base``."""
        pub = hf.to_diff_dict()
        pub.update(model_type=self.model_type, architectures=list(self.architectures))
        for sub in ("text_config", "vision_config"):  # the load dtype reaches the sub-configs; published ones lack it
            if isinstance(pub.get(sub), dict) and "dtype" not in ((base or {}).get(sub) or {}):
                pub[sub].pop("dtype", None)
        for key, value in (base or {}).items():
            if key not in pub and key not in _OURS:
                pub[key] = value
        return pub

    def tiny(self, *, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, mask_token_id,
             eos_token_id, pad_token_id, block_size, max_position_embeddings, tie_word_embeddings, rope_theta,
             num_experts=4, experts_per_token=2, moe_intermediate_size=16) -> dict[str, Any]:
        """One sliding and one full layer per pair (the last layer is full, as the stock config requires), MoE beside
        the dense MLP, a one-layer Gemma-4 vision tower of width 16, ``canvas_length = block_size``, tied as
        published unless ``tie_word_embeddings=False``. Gemma's ids by default: pad 0, eos 1, bos 2; the image ids
        are the last three."""
        if mask_token_id is not None:
            raise TypeError("tiny_config('diffusion_gemma'): uniform-state diffusion has no mask token")
        head_dim = hidden_size // num_heads
        text = {
            "model_type": "diffusion_gemma_text", "vocab_size": vocab_size, "hidden_size": hidden_size,
            "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "head_dim": head_dim,
            "global_head_dim": head_dim, "sliding_window": 8, "max_position_embeddings": max_position_embeddings,
            "layer_types": ["sliding_attention" if i % 2 == 0 and i < num_layers - 1 else "full_attention"
                            for i in range(num_layers)],
            "enable_moe_block": True, "num_experts": num_experts, "top_k_experts": experts_per_token,
            "moe_intermediate_size": moe_intermediate_size,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": float(rope_theta)},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": float(rope_theta) * 100},
            },
            "pad_token_id": 0 if pad_token_id is None else pad_token_id,
            "eos_token_id": 1 if eos_token_id is None else eos_token_id, "bos_token_id": 2,
        }
        vision = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "patch_size": 4,
                  "pooling_kernel_size": 2, "position_embedding_size": 64}
        cfg = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=block_size,
                                   tie_word_embeddings=bool(tie_word_embeddings), boi_token_id=vocab_size - 3,
                                   eoi_token_id=vocab_size - 2, image_token_id=vocab_size - 1)
        cfg.architectures = list(self.architectures)
        return self.published_config(cfg, None)

    def block_size_of(self, pub: dict[str, Any]) -> int | None:
        return int(pub.get("canvas_length") or self.block_size)

    def tied(self, pub: dict[str, Any]) -> bool:
        return bool(pub.get("tie_word_embeddings", True))

    # -- tensors: the names are HF's; only the tied copies are added on load and left out on save --------------------
    def to_hf_state(self, tensors: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        state = dict(tensors)
        if not hf.tie_word_embeddings:
            return state
        for name, tensor in tensors.items():
            twin = _ENCODER + name.removeprefix(_DECODER)
            if name.startswith(_DECODER) and _is_tied(twin):
                state.setdefault(twin, tensor)
        if "model.decoder.embed_tokens.weight" in tensors:
            state.setdefault("lm_head.weight", tensors["model.decoder.embed_tokens.weight"])
        return state

    def to_published_state(self, state: dict[str, torch.Tensor], hf: PretrainedConfig) -> dict[str, torch.Tensor]:
        if not hf.tie_word_embeddings:
            return dict(state)
        return {k: v for k, v in state.items()
                if not (k.startswith(_ENCODER) and _is_tied(k)) and k != "lm_head.weight"}


DIFFUSION_GEMMA = DiffusionGemma(
    name="diffusion_gemma", attention="block", shift=False, mask_token_id=None, noise="uniform", eos_token_id=1,
    pad_token_id=0, model_type="diffusion_gemma", architectures=("DiffusionGemmaForBlockDiffusion",), block_size=256,
    block_size_key="canvas_length", moe=True, router_stack="model.encoder.language_model", tiny_extra_ids=3,
    hf_auto_class=AutoModelForImageTextToText,
    lora_target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    lora_scope=("model.decoder", "model.encoder.language_model"),
    fsdp_units=("DiffusionGemmaEncoderTextLayer", "DiffusionGemmaDecoderTextLayer", "Gemma4VisionEncoderLayer"),
    fsdp_reader_units=("DiffusionGemmaDecoderModel",),
)
