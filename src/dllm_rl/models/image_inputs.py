"""Prompt texts with ``<image>`` placeholders and their images, as what :func:`dllm_rl.sampling.generate` takes.

A task's prompt marks each image with ``<image>`` (:data:`dllm_rl.tasks.images.IMAGE_PLACEHOLDER`); how an image
reaches the model depends on the family, so this is the one place that knows it:

- ``llada_v``: each placeholder becomes the published id -200 between the text pieces' ids, then
  :func:`dllm_rl.models.llava_images.prompt_images` widens it to the image's positions and returns the
  features as :class:`~dllm_rl.models.prompt_images.PromptImages` (one tower run per distinct image);
- ``mmada``: the image's MAGVIT-v2 codes become prompt ids, ``[<|mmu|>, <|soi|>, codes + len(tokenizer), <|eoi|>,
  chat ids]`` (:func:`dllm_rl.models.mmada_image.understanding_ids`, the published layout: image first, one per
  prompt), the placeholder lines dropped from the chat text; the encoder is :func:`vq_encoder_for`'s;
- any other family takes no image: a one-line :class:`~dllm_rl.errors.UserError`.

:func:`image_spans` says where each prompt's image sits (for the trace viewer, which draws it there).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from dllm_rl.errors import UserError
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.magvit import MagvitConfig, MagvitEncoder, load_vq_encoder
from dllm_rl.models.prompt_images import PromptImages

PLACEHOLDER = "<image>"  # the task's marker (dllm_rl.tasks.images.IMAGE_PLACEHOLDER; not imported: no cycle)
IMAGE_FAMILIES = ("llada_v", "mmada")
#: where an MMaDA checkpoint directory keeps its MAGVIT-v2 encoder (``showlab/magvitv2``'s files)
VQ_FOLDER = "vq_model"


def takes_images(family_name: str) -> bool:
    return family_name in IMAGE_FAMILIES


def refuse_images(family_name: str, what: str) -> None:
    """The one-line error for images given to a text-only family (``what`` names where they came from)."""
    if not takes_images(family_name):
        raise UserError(f"{what} has images but a {family_name} model reads text only; use an image model "
                        f"({' or '.join(IMAGE_FAMILIES)}) or a text task")


def vq_encoder_for(model_dir: str | Path, device: str | torch.device = "cpu") -> tuple[MagvitEncoder, int]:
    """The MAGVIT-v2 encoder in ``model_dir/vq_model`` and the image side it reads (published: 512 px).

    The published MMaDA recipes name the encoder's folder in their own config (``vq_model_path``); a checkpoint
    directory here carries it as ``vq_model/`` so that one path is the whole model. Its ``config.json``, when
    present, may give the encoder sizes (:class:`~dllm_rl.models.magvit.MagvitConfig` fields) and
    ``resolution``; unknown keys are ignored, missing ones take the published values."""
    folder = Path(model_dir) / VQ_FOLDER
    if not folder.is_dir():
        raise UserError(f"{model_dir}: an mmada checkpoint needs its MAGVIT-v2 image encoder in {folder} "
                        "(the showlab/magvitv2 files) to read images; copy them there")
    cfg_file = folder / "config.json"
    raw = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()
              if k in MagvitConfig.__dataclass_fields__}
    return load_vq_encoder(folder, MagvitConfig(**fields), device), int(raw.get("resolution", 512))


def _llava_ids(tokenizer, text: str) -> list[int]:
    from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX

    ids: list[int] = []
    for j, piece in enumerate(text.split(PLACEHOLDER)):
        if j:
            ids.append(IMAGE_TOKEN_INDEX)
        if piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


def _mmada_ids(model: DiffusionLM, tokenizer, text: str, images: Sequence[Image.Image], where: str,
               vq: tuple[MagvitEncoder, int]) -> list[int]:
    from dllm_rl.models.mmada_image import code_offset, image_transform, understanding_ids

    if len(images) != 1:
        raise UserError(f"{where}: {len(images)} images; MMaDA reads one image per prompt (its published "
                        "understanding layout puts the image first)")
    chat = text.replace(f"{PLACEHOLDER}\n", "").replace(PLACEHOLDER, "")
    encoder, side = vq
    pixels = image_transform(images[0], side)[None].to(next(encoder.parameters()).device)
    with torch.no_grad():
        codes = encoder.codes(pixels)[0]
    chat_ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
    return understanding_ids(codes, chat_ids, code_offset(tokenizer), int(model.config.vocab_size)).tolist()


def image_prompt_inputs(model: DiffusionLM, tokenizer, texts: Sequence[str],
                        images: Sequence[Sequence[Image.Image]], where: Sequence[str] | None = None,
                        vq: tuple[MagvitEncoder, int] | None = None) -> tuple[list[list[int]], PromptImages | None]:
    """Prompt ids for ``texts[i]`` with ``images[i]`` in its placeholders, and the LLaDA-V features to splice
    (None for MMaDA, whose images are ids). ``where[i]`` names the row in errors (a placeholder count that
    differs from the image count); ``vq`` is MMaDA's :func:`vq_encoder_for`."""
    name = model.family.name
    refuse_images(name, "the prompt")
    where = list(where) if where is not None else [f"prompt {i}" for i in range(len(texts))]
    for w, text, imgs in zip(where, texts, images):
        k = text.count(PLACEHOLDER)
        if k != len(imgs):
            raise UserError(f"{w}: the prompt has {k} {PLACEHOLDER!r} placeholder(s) but {len(imgs)} image(s); "
                            "give one image per placeholder")
    if name == "mmada":
        if vq is None:
            raise UserError("mmada prompts with images need the MAGVIT-v2 encoder (vq=vq_encoder_for(model_dir))")
        return [_mmada_ids(model, tokenizer, t, imgs, w, vq) for t, imgs, w in zip(texts, images, where)], None
    from dllm_rl.models.llava_images import prompt_images

    return prompt_images(model, [_llava_ids(tokenizer, t) for t in texts], [list(i) for i in images])


def image_spans(model: DiffusionLM, prompt_ids: Sequence[Sequence[int]], images: PromptImages | None
                ) -> list[list[tuple[int, int]]]:
    """``(offset, length)`` of each image's run in each prompt: LLaDA-V's spliced features, MMaDA's codes
    between ``<|soi|>`` and ``<|eoi|>``; ``[]`` for a prompt without an image."""
    if images is not None:
        return [images.spans(b) for b in range(len(images))]
    if model.family.name != "mmada":
        return [[] for _ in prompt_ids]
    from dllm_rl.models.families.mmada import EOI_ID, SOI_ID

    out = []
    for ids in prompt_ids:
        ids = list(ids)
        if SOI_ID in ids and EOI_ID in ids[ids.index(SOI_ID):]:
            s = ids.index(SOI_ID) + 1
            out.append([(s, ids.index(EOI_ID, s) - s)])
        else:
            out.append([])
    return out


__all__ = ["IMAGE_FAMILIES", "VQ_FOLDER", "image_prompt_inputs", "image_spans", "refuse_images", "takes_images",
           "vq_encoder_for"]
