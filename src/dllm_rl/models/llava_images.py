"""Images in a LLaDA-V prompt: pixels, features, and their place in the prompt.

A prompt carries one placeholder id :data:`IMAGE_TOKEN_INDEX` (-200, the published ``<image>`` id) per image;
each is replaced by that image's features (729 patch embeddings + one ``image_newline`` for ``pad``; the base
tile's 729, then the unpadded tile grid with a newline per row for ``anyres_max_N``). Attention is bidirectional
over everything, image included.

- :func:`preprocess`: pixels through transformers' PIL image processors (``pad``: the published gray
  ``(127, 127, 127)`` square, then a 384 px SigLIP resize, computed without building the square at full size
  (:func:`~dllm_rl.models.square_image.square_resize`, the same pixels); ``anyres_max_N``: LLaVA-OneVision's
  tiling over the config's grid pinpoints), no torchvision.
- :func:`image_features`: the shortened SigLIP tower's last hidden state (before ``post_layernorm``), the
  projector, and transformers' ``LlavaOnevisionModel.pack_image_features`` (unpad, anyres_max resize,
  newlines).
- :func:`prompt_images`: (prompt ids with placeholders, images) -> the prompts with each placeholder widened to
  its image's positions and the :class:`~dllm_rl.models.prompt_images.PromptImages` saying where which features
  go (each distinct image encoded once): what the sampler and the estimators take.
- :func:`image_prompts`: (prompt ids with placeholders, images) -> :class:`ImagePrompts`: left-padded ids with
  each placeholder widened to its image's length, the valid mask, and the :class:`EmbedSplice` that puts the
  features there. ``dlm(prompts.input_ids, attention_mask=prompts.valid, splice=prompts.splice)`` is the
  published ``lm_head(model(inputs_embeds=spliced).last_hidden_state)``; a completion appended to the ids
  (and ``True`` to the mask) keeps the same splice, whose ``where`` is padded with ``False``.

Image sizes are (height, width) here, as transformers wants them; the published code passes (width, height) to
its own functions, which read them that way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import LlavaOnevisionImageProcessorPil, SiglipImageProcessorPil

from dllm_rl.errors import UserError
from dllm_rl.models.diffusion_lm import DiffusionLM, EmbedSplice
from dllm_rl.models.families.llada_v import aspect_ratio, grid_pinpoints, vision_config
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.models.square_image import square_resize

IMAGE_TOKEN_INDEX = -200
# SigLIP's normalisation; the pad colour is int(0.5 * 255) per channel, as the published code computes it.
_MEAN = _STD = (0.5, 0.5, 0.5)
_GRAY = (127, 127, 127)


@dataclass
class ImagePrompts:
    """A batch of prompts with their images spliced in (``[B, T]``, left-padded).

    ``input_ids``: text ids, and the pad id at image positions and padding; ``valid``: real positions;
    ``image``: positions holding image features (never masked or scored); ``splice``: the features
    (``splice.where`` equals ``image``)."""

    input_ids: torch.Tensor
    valid: torch.Tensor
    image: torch.Tensor
    splice: EmbedSplice


def preprocess(images: Sequence[Image.Image], published_config: dict) -> tuple[list[torch.Tensor], list[tuple]]:
    """Pixels of each image (``[tiles, 3, S, S]`` float32; one tile for ``pad``) and its (height, width)."""
    size = int(vision_config(published_config)["image_size"])
    ratio = aspect_ratio(published_config)
    tiler = LlavaOnevisionImageProcessorPil(image_mean=_MEAN, image_std=_STD, size={"height": size, "width": size},
                                            image_grid_pinpoints=grid_pinpoints(published_config), do_pad=False)
    resizer = SiglipImageProcessorPil(image_mean=_MEAN, image_std=_STD, size={"height": size, "width": size})
    pixels, sizes = [], []
    for img in images:
        rgb = img.convert("RGB")
        sizes.append((rgb.height, rgb.width))
        if ratio == "pad":  # the square already has the tower's side: the processor rescales and normalises it
            out = resizer(square_resize(rgb, size, _GRAY), return_tensors="pt")["pixel_values"]
        else:
            out = torch.as_tensor(np.asarray(tiler(rgb)["pixel_values"][0]))
        pixels.append(out.float())
    return pixels, sizes


#: which image parts train (``train_vision``): none (the features are data, as the published LLaDA-V SFT and RL
#: compute them), the projector (and the image newline) over a frozen tower, or the tower too (LLaVA's
#: ``mm_tunable_parts`` ``mm_vision_tower,mm_mlp_adapter``)
TRAIN_VISION = ("none", "projector", "all")


def image_features(dlm: DiffusionLM, pixels: Sequence[torch.Tensor], sizes: Sequence[tuple],
                   train: str = "all") -> list[torch.Tensor]:
    """Each image's embeddings ``[N_i, H]`` (the model's dtype) from :func:`preprocess`'s output; ``train``
    (:data:`TRAIN_VISION`) says which parts the graph reaches (call under ``torch.no_grad()`` for none)."""
    core = dlm.causal_lm.model  # the stock LlavaOnevisionModel
    tiles = torch.cat(list(pixels)).to(device=dlm.device, dtype=dlm.dtype)
    with torch.set_grad_enabled(torch.is_grad_enabled() and train == "all"):
        hidden = core.vision_tower(tiles, output_hidden_states=True).hidden_states[-1]  # before post_layernorm
    per_image = torch.split(core.multi_modal_projector(hidden), [p.shape[0] for p in pixels])
    ratio = aspect_ratio(dlm.published_config)
    packed, _ = core.pack_image_features(
        list(per_image), torch.tensor(sizes, device=dlm.device), image_newline=core.image_newline,
        vision_aspect_ratio=ratio if ratio != "pad" else "anyres_max_9")  # pad: one tile, the ratio is unused
    return packed


def _check_counts(prompts: Sequence[Sequence[int]], images: Sequence[Sequence[Image.Image]]) -> None:
    if len(prompts) != len(images):
        raise UserError(f"{len(prompts)} prompts but {len(images)} image lists: give one list of images per prompt")
    for i, (ids, imgs) in enumerate(zip(prompts, images)):
        n = sum(1 for t in ids if int(t) == IMAGE_TOKEN_INDEX)
        if n != len(imgs):
            raise UserError(f"prompt {i} has {n} image placeholder(s) ({IMAGE_TOKEN_INDEX}, '<image>') but "
                            f"{len(imgs)} image(s) were given: give one image per placeholder, in order")


def _identity(image: Image.Image) -> tuple:
    """What makes two images the same input to the tower: mode, size and pixel bytes."""
    return image.mode, image.size, hashlib.blake2b(image.tobytes(), digest_size=16).digest()


def prompt_images(dlm: DiffusionLM, prompts: Sequence[Sequence[int]], images: Sequence[Sequence[Image.Image]],
                  train: str = "none") -> tuple[list[list[int]], PromptImages]:
    """``prompts`` with each placeholder widened to its image's positions (the pad id there), and the
    :class:`~dllm_rl.models.prompt_images.PromptImages` that splices the features in: what
    :func:`dllm_rl.sampling.generate` takes (``images=``) and its :class:`~dllm_rl.sampling.Rollout` keeps.

    The tower and projector run once, over the distinct images only (same mode, size and pixels = same image):
    G samples of one prompt share one encoding. The features are data (computed without gradient), so the
    scoring of a rollout reuses them as they were sampled with; ``train`` (:data:`TRAIN_VISION`, SFT's
    ``model.train_vision``) other than none keeps the graph into the projector (and the tower)."""
    if train not in TRAIN_VISION:
        raise ValueError(f"train_vision must be one of {', '.join(TRAIN_VISION)}, got {train!r}")
    _check_counts(prompts, images)
    keys = [[_identity(img) for img in imgs] for imgs in images]
    index: dict[tuple, int] = {}
    distinct: list[Image.Image] = []
    for imgs, ks in zip(images, keys):
        for img, key in zip(imgs, ks):
            if key not in index:
                index[key] = len(distinct)
                distinct.append(img)
    with torch.set_grad_enabled(torch.is_grad_enabled() and train != "none"):
        feats = list(image_features(dlm, *preprocess(distinct, dlm.published_config), train)) if distinct else []
    widened, rows = [], []
    for ids, ks in zip(prompts, keys):
        row: list[int] = []
        spans = []
        todo = iter(ks)
        for t in ids:
            if int(t) == IMAGE_TOKEN_INDEX:
                k = index[next(todo)]
                spans.append((len(row), k))
                row += [dlm.pad_token_id] * int(feats[k].shape[0])
            else:
                row.append(int(t))
        widened.append(row)
        rows.append(tuple(spans))
    return widened, PromptImages(feats, rows)


def image_prompts(dlm: DiffusionLM, prompts: Sequence[Sequence[int]],
                  images: Sequence[Sequence[Image.Image]]) -> ImagePrompts:
    """Splice ``images[i]`` (in order) into the placeholders of ``prompts[i]``; see the module docstring."""
    widened, pim = prompt_images(dlm, prompts, images)
    width = max(len(r) for r in widened)
    device = dlm.device
    input_ids = torch.full((len(widened), width), dlm.pad_token_id, dtype=torch.long)
    valid = torch.zeros((len(widened), width), dtype=torch.bool)
    for i, row in enumerate(widened):
        input_ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        valid[i, width - len(row):] = True
    starts = torch.tensor([width - len(r) for r in widened], device=device)
    splice = pim.splice(starts, width)
    if not pim.features:
        splice.vectors = torch.zeros(0, dlm.config.hidden_size, dtype=dlm.dtype, device=device)
    return ImagePrompts(input_ids.to(device), valid.to(device), splice.where, splice)
