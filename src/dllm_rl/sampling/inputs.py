"""The checks every decoding call makes before its first forward pass: the decoding config against the model
(:func:`check_config`) and the prompts, seeds and images against both (:func:`check_inputs`), each failure one
:class:`~dllm_rl.errors.UserError` naming what to change."""

from __future__ import annotations

import torch

from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import canvas_width
from dllm_rl.sampling.config import DecodeConfig


def decode_block_length(model: DiffusionLM, config: DecodeConfig) -> int:
    """The decoding block: the attention block for block models (``config.block_size``, else the model's own),
    ``config.block_length`` for full attention."""
    return model.layout_block(config.block_size) if model.is_block_causal else config.block_length


def check_config(model: DiffusionLM, config: DecodeConfig) -> int:
    """The user errors of a decoding config on ``model`` (its block fields and sub-blocks); returns the decoding
    block."""
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if config.block_size is not None and not model.is_block_causal:
        raise UserError(f"block_size ({config.block_size}) is the attention block of block models (SDAR/TraDo); "
                        "a full-attention model decodes in block_length")
    block = decode_block_length(model, config)
    what = (f"block_length ({block})" if not model.is_block_causal else f"the model's block_size ({block})"
            if config.block_size is None else f"block_size ({block})")
    if config.gen_length % block:
        raise UserError(f"gen_length ({config.gen_length}) must be a multiple of {what}")
    if config.sub_block is not None and block % config.sub_block:
        raise UserError(f"sub_block ({config.sub_block}) must divide {what}")
    return block


def check_inputs(model: DiffusionLM, prompts, config: DecodeConfig, seeds,
                 images: PromptImages | None = None, max_positions: int | None = None) -> list[list[int]]:
    """Every user error, raised before any forward pass; returns the prompts as lists of ints. A prompt with its
    completion slots may take the model's context, or ``max_positions`` when that is smaller (the engine's bound on
    a request)."""
    block = check_config(model, config)
    if len(prompts) == 0:
        raise UserError("generate: no prompts given")
    if seeds is not None and len(seeds) != len(prompts):
        raise UserError(f"got {len(seeds)} seeds for {len(prompts)} prompts; give one seed per prompt")
    vocab, context = int(model.config.vocab_size), model.max_length
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            raise TypeError(f"prompt {i} is a string; tokenize it first (generate takes token ids)")
        ids = [int(t) for t in (p.tolist() if torch.is_tensor(p) else p)]
        if not ids:
            raise UserError(f"prompt {i} is empty")
        if min(ids) < 0 or max(ids) >= vocab:
            raise UserError(f"prompt {i} has token ids outside the model's vocabulary [0, {vocab})")
        need = canvas_width(len(ids), config.gen_length, block, model.is_block_causal)
        for limit, bound, remedy in (
            (context, f"the model's context is {context} (max_position_embeddings)", ""),
            (max_positions, f"max_positions is {max_positions}", ", or raise max_positions"),
        ):
            if limit is not None and need > limit:
                raise UserError(f"prompt {i} has {len(ids)} tokens; with gen_length {config.gen_length} it needs "
                                f"{need} positions but {bound}; shorten the prompt or gen_length{remedy}")
        out.append(ids)
    if images is not None:
        check_images(model, images, out)
    return out


def check_images(model: DiffusionLM, images: PromptImages, prompts: list[list[int]]) -> None:
    """Image features go into LLaDA-V prompts only, one row per prompt, at placeholders the prompts hold."""
    if model.is_block_causal or model.family.name != "llada_v":
        raise UserError(f"images: image features are spliced into llada_v prompts only; a "
                        f"{model.family.name} model takes none (mmada reads images as prompt ids: "
                        "dllm_rl.models.image_inputs.PromptEncoder)")
    try:
        images.check([len(p) for p in prompts], int(model.config.hidden_size))
    except ValueError as err:
        raise UserError(f"generate: {err}; build prompts and images with "
                        "dllm_rl.models.llava_images.prompt_images") from None
