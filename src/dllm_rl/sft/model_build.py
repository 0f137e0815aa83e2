"""The model an SFT config names: the tokenizer and a loaded checkpoint or a fresh model sized to it.

A fresh model takes the family's published config at the ``model.*`` sizes (LLaDA-V's vision side from
``model.vision_*``), optionally redrawn at ``model.init_std``; SFT, DPO and the tests that build tiny demo-shaped
models all start here.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_rl.config import ConfigError
from dllm_rl.models import DiffusionLM, build_model, char_tokenizer, load_model, load_tokenizer, tiny_config
from dllm_rl.models.devices import resolve_eval_dtype
from dllm_rl.models.families import get_family
from dllm_rl.models.families.llada_v import SO400M_VISION
from dllm_rl.models.tokenizer import DEFAULT_ALPHABET
from dllm_rl.sft.config import ModelConfig


def reinit_weights(dlm: DiffusionLM, std: float, seed: int = 0) -> None:
    """Redraw every weight matrix of ``dlm`` (ndim >= 2) from N(0, std^2); norms and biases keep their init."""
    g = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for _, p in dlm.model.named_parameters():
            if p.ndim >= 2 and id(p) not in seen:
                seen.add(id(p))
                p.copy_(torch.randn(p.shape, generator=g) * std)


def vision_shape(cfg: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` keys of a fresh LLaDA-V's vision side from ``model.vision_*``: the SigLIP tower's shape
    (``vision_config``, its ``mm_hidden_size``) and ``image_aspect_ratio``; the rest is the published so400m's."""
    tower = {**SO400M_VISION, "image_size": cfg.vision_image_size, "patch_size": cfg.vision_patch_size,
             "hidden_size": cfg.vision_hidden_size, "intermediate_size": 2 * cfg.vision_hidden_size,
             "num_attention_heads": cfg.vision_num_heads, "num_hidden_layers": cfg.vision_num_layers}
    return {"vision_config": tower, "mm_hidden_size": cfg.vision_hidden_size,
            "image_aspect_ratio": cfg.image_aspect_ratio}


def build_tokenizer_and_model(cfg: ModelConfig, seed: int = 0, device: torch.device | str = "cpu"
                              ) -> tuple[Any, DiffusionLM]:
    """The tokenizer and model of a :class:`ModelConfig` (a fresh model is sized to the tokenizer), in
    ``model.dtype`` (``auto`` resolved for ``device``, where the model will train)."""
    dtype = resolve_eval_dtype(cfg.dtype, torch.device(device))
    if cfg.tokenizer == "char":
        tok = char_tokenizer(cfg.alphabet or DEFAULT_ALPHABET, words=cfg.words)
    elif cfg.tokenizer is None:
        if cfg.path is None:
            raise ConfigError("model.tokenizer: null is the checkpoint's own tokenizer and there is no checkpoint "
                              "(model.path: null builds a fresh model); set model.tokenizer=char or a tokenizer "
                              "directory, or model.path")
        tok = None
    else:
        tok = load_tokenizer(cfg.tokenizer)
    if cfg.path is not None:
        dlm = load_model(cfg.path, dtype=dtype, attn_implementation=cfg.attn_implementation)
        if tok is None:
            tok = load_tokenizer(cfg.path, mask_token_id=dlm.mask_token_id, noise=dlm.family.noise)
    else:
        fam = get_family(cfg.family)
        moe = {k: getattr(cfg, k) for k in ("num_experts", "experts_per_token", "moe_intermediate_size")
               if getattr(cfg, k) is not None}
        pub = tiny_config(
            cfg.family, vocab_size=len(tok) + fam.tiny_extra_ids, hidden_size=cfg.hidden_size,
            num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
            intermediate_size=cfg.intermediate_size,
            mask_token_id=None if fam.mask_token_id is None else tok.mask_token_id,  # uniform-state: none
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, block_size=cfg.block_size,
            max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
            **moe,
        )
        if cfg.family == "llada_v":
            pub.update(vision_shape(cfg))
        dlm = build_model(cfg.family, pub, seed=seed, dtype=dtype, attn_implementation=cfg.attn_implementation)
        if cfg.init_std is not None:
            reinit_weights(dlm, cfg.init_std, seed)
    if dlm.mask_token_id is not None and tok.mask_token_id != dlm.mask_token_id:  # uniform-state noise: no mask
        raise ValueError(f"tokenizer mask id {tok.mask_token_id} != model mask_token_id {dlm.mask_token_id}")
    return tok, dlm
