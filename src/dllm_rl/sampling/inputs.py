"""The checks every decoding call makes before its first forward pass: the decoding config against the model
(:func:`check_config`) and the prompts, seeds and images against both (:func:`check_inputs`), each failure one
:class:`~dllm_rl.errors.UserError` naming what to change.

:func:`uniform_noise` is where decoding reads the family's kind of noise: the front door
(:func:`dllm_rl.sampling.generate`), these checks, the engine's constructor (which hands a uniform-state model to
:class:`~dllm_rl.sampling.uniform_engine.UniformEngine`) and the server's request fields ask it, nothing else."""

from __future__ import annotations

import dataclasses
import numbers

from dllm_rl.config import FieldError
from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import canvas_width
from dllm_rl.sampling.config import UNIFORM_FIELDS, DecodeConfig
from dllm_rl.sampling.uniform import UniformDecodeConfig

#: DecodeConfig fields that only masked diffusion reads: a uniform-state family refuses them at any other value
MASK_FIELDS: tuple[str, ...] = ("block_length", "block_size", "steps", "threshold", "sub_block", "confidence",
                                "temperature", "top_k", "top_p", "remasking", "cache")


def uniform_noise(model: DiffusionLM) -> bool:
    """Whether ``model`` removes uniform-state noise (DiffusionGemma: random ids, re-noised) rather than masks."""
    return model.family.noise == "uniform"


def uniform_decode_config(config: DecodeConfig) -> UniformDecodeConfig:
    """The uniform-state sampler's config of ``config``: ``gen_length`` as its budget, the stock defaults where a
    uniform field is None."""
    given = {k: getattr(config, k) for k in UNIFORM_FIELDS if getattr(config, k) is not None}
    try:
        return UniformDecodeConfig(max_new_tokens=config.gen_length, **given)
    except FieldError as exc:
        raise UserError(f"{exc.key}: {exc.problem}") from None


def check_family_fields(family, config: DecodeConfig) -> None:
    """The decoding fields ``family``'s kind of noise reads, without the model (an evaluation checks each setting
    before loading it): a uniform-state family refuses the mask-only fields and takes its own only as a valid
    schedule (t_max above t_min); a masked family refuses the uniform-state fields."""
    name = family.name
    if getattr(family, "noise", "mask") != "uniform":
        for key in UNIFORM_FIELDS:
            if getattr(config, key) is not None:
                raise UserError(f"{key}={getattr(config, key)!r} is a uniform-state diffusion option "
                                f"(DiffusionGemma); {name} is masked diffusion: drop {key}")
        return
    defaults = {f.name: f.default for f in dataclasses.fields(DecodeConfig)}
    for key in MASK_FIELDS:
        if getattr(config, key) != defaults[key]:
            raise UserError(f"{key}={getattr(config, key)!r} is a masked-diffusion option; {name} is uniform-state "
                            "diffusion (no mask token) and takes gen_length, stop_on_eos, seed and "
                            f"{', '.join(UNIFORM_FIELDS)}: drop {key}")
    uniform_decode_config(config)


def _check_uniform(model: DiffusionLM, config: DecodeConfig) -> int:
    """A uniform-state family's config: no mask-only option, a canvas within the model's positions, whole canvases;
    returns the canvas."""
    name = model.family.name
    check_family_fields(model.family, config)
    canvas = model.layout_block()
    if canvas > model.max_length:
        raise UserError(f"canvas_length ({canvas}, the model's config.json) exceeds the model's context of "
                        f"{model.max_length} positions (max_position_embeddings); fix the checkpoint's config")
    if config.gen_length % canvas:
        raise UserError(f"gen_length ({config.gen_length}) must be a multiple of the model's canvas_length ({canvas}); "
                        f"{name} decodes whole canvases")
    return canvas


def decode_block_length(model: DiffusionLM, config: DecodeConfig) -> int:
    """The decoding block: the attention block for block models (``config.block_size``, else the model's own),
    ``config.block_length`` for full attention."""
    return model.layout_block(config.block_size) if model.is_block_causal else config.block_length


def check_config(model: DiffusionLM, config: DecodeConfig) -> int:
    """The user errors of a decoding config on ``model`` (its block fields and sub-blocks); returns the decoding
    block."""
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if uniform_noise(model):
        return _check_uniform(model, config)
    check_family_fields(model.family, config)
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
                 images: PromptImages | None = None, max_positions: int | None = None,
                 budget: tuple[str, int] | None = None) -> list[list[int]]:
    """Every user error, raised before any forward pass; returns the prompts as lists of ints. A prompt with its
    completion slots may take the model's context, or ``max_positions`` when that is smaller (the engine's bound on
    a request). ``budget``: the completion budget's name and value as its user gave them, for the errors (the
    server's ``("max_tokens", 100)``, decoded as whole blocks); None: ``gen_length``."""
    block = check_config(model, config)
    prompts = _items(prompts, "prompts", "a list of prompts, each a list of token ids")
    if len(prompts) == 0:
        raise UserError("generate: no prompts given")
    if seeds is not None and len(seeds) != len(prompts):
        raise UserError(f"got {len(seeds)} seeds for {len(prompts)} prompts; give one seed per prompt")
    vocab = int(model.config.vocab_size)
    out = []
    for i, p in enumerate(prompts):
        ids = prompt_ids(p, f"prompt {i}")
        if not ids:
            raise UserError(f"prompt {i} is empty")
        if min(ids) < 0 or max(ids) >= vocab:
            raise UserError(f"prompt {i} has token ids outside the model's vocabulary [0, {vocab})")
        check_fits(model, config, block, len(ids), f"prompt {i}", max_positions, budget)
        out.append(ids)
    if images is not None:
        check_images(model, images, out)
    return out


#: what :func:`split_prompts` takes (``dllm_rl.generate``'s prompts), as its errors name it
PROMPT_FORMS = "a string, a list of strings, a list of token ids or a list of lists of token ids"


def _shown(value) -> str:
    """``value`` as an error names it: its repr (cut short) and its type."""
    text = repr(value)
    return f"{text[:40]}... ({type(value).__name__})" if len(text) > 43 else f"{text} ({type(value).__name__})"


def _items(value, what: str, accepted: str) -> list:
    """``value``'s items (a tensor's or array's as Python values); a string or a non-iterable is refused, naming
    ``what`` was given and what is ``accepted``."""
    items = value.tolist() if hasattr(value, "tolist") and not isinstance(value, str | bytes) else value
    if isinstance(items, str | bytes) or not hasattr(items, "__iter__"):  # a 0-d tensor's tolist() is a number
        raise UserError(f"{what} is {_shown(value)}; give {accepted}")
    return list(items)


def _token_id(value) -> bool:
    """Whether ``value`` is a token id: an integer (Python's or numpy's), not a bool nor a float that looks whole."""
    return type(value) is int or isinstance(value, numbers.Integral) and not isinstance(value, bool)


def prompt_ids(prompt, what: str) -> list[int]:
    """One prompt's token ids as Python ints (a list, tuple, integer tensor or array); anything else, or an id that
    is not an integer (1.5 would decode as 1), is refused naming ``what`` and the value given."""
    if isinstance(prompt, str):
        raise UserError(f"{what} is a string ({_shown(prompt)}); tokenize it first: this call takes token ids "
                        "(dllm_rl.generate encodes texts)")
    ids = []
    for j, t in enumerate(_items(prompt, what, "a list of token ids (integers)")):  # checked and converted at once
        if not _token_id(t):
            raise UserError(f"{what} has {_shown(t)} at position {j}; token ids are integers")
        ids.append(int(t))
    return ids


def split_prompts(prompts) -> tuple[list, bool]:
    """``dllm_rl.generate``'s ``prompts`` (:data:`PROMPT_FORMS`) as a list of prompts, and whether they are texts
    (to encode) rather than token ids (checked by :func:`check_inputs`): a string or a flat list of numbers is one
    prompt. A mix of texts and ids, or anything else, is refused naming what was given."""
    if isinstance(prompts, str):
        return [prompts], True
    items = _items(prompts, "prompts", PROMPT_FORMS)
    texts = [isinstance(p, str) for p in items]
    if any(texts) and not all(texts):
        other = items[texts.index(False)]
        raise UserError(f"prompts mix strings and other values (prompt {texts.index(True)} is a string, prompt "
                        f"{texts.index(False)} is {_shown(other)}); give {PROMPT_FORMS}")
    if not any(texts) and any(isinstance(p, numbers.Number) for p in items):
        return [items], False  # one prompt's ids; a float among them is refused by check_inputs
    return items, bool(items) and all(texts)


def check_fits(model: DiffusionLM, config: DecodeConfig, block: int, tokens: int, what: str,
               max_positions: int | None = None, budget: tuple[str, int] | None = None) -> None:
    """A prompt of ``tokens`` tokens (named ``what`` in the error) with its ``config.gen_length`` completion slots
    at decoding block ``block`` fits the model's context, and ``max_positions`` when given (a prompt's canvas only
    grows with its length, so checking the longest prompt checks them all). ``budget``: as :func:`check_inputs`'s."""
    context = model.max_length
    need = positions_needed(model, tokens, config.gen_length, block)
    name, given = budget or ("gen_length", config.gen_length)
    slots = "" if given == config.gen_length else f" (decoded as {config.gen_length} slots, whole blocks)"
    for limit, bound, remedy in (
        (context, f"the model's context is {context} (max_position_embeddings)", ""),
        (max_positions, f"max_positions is {max_positions}", ", or raise max_positions"),
    ):
        if limit is not None and need > limit:
            raise UserError(f"{what} has {tokens} tokens; with {name} {given}{slots} it needs {need} "
                            f"positions but {bound}; shorten the prompt or {name}{remedy}")


def positions_needed(model: DiffusionLM, tokens: int, gen_length: int, block: int) -> int:
    """The positions a prompt of ``tokens`` tokens and ``gen_length`` completion slots takes: its canvas (block
    models pad the prompt to whole blocks), or, uniform-state, the prompt then whole canvases."""
    if uniform_noise(model):
        return tokens + gen_length
    return canvas_width(tokens, gen_length, block, model.is_block_causal)


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
