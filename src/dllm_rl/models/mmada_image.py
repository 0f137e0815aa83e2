"""MMaDA's image path for understanding: pixels, codes as prompt ids, and the prompt layout.

Facts read from the published code (Gen-Verse/dLLM-RL ``sample/mmada_v_sample.py``, ``mmada_v_rl_rollout.py``,
``train/train_mmada_v_policy.py``):

- transform: the RGB image padded to a white square (the short side padded, ``pad // 2`` before and the rest
  after), resized to ``resolution`` (512) with bicubic resampling, scaled to [0, 1] and normalised with mean
  and std 0.5 (to [-1, 1]). Written with Pillow and torch: the published code uses torchvision, whose
  registry wheel does not import next to a CPU torch; Pillow's resize is what torchvision calls on images.
- the understanding prompt is ``[<|mmu|>, <|soi|>, codes + offset, <|eoi|>, chat ids]``; the offset is
  ``len(tokenizer)`` (126349 for LLaDA's tokenizer), *not* ``llm_vocab_size``. Rows are left-padded with eos
  and run without an attention mask (the pads are attended; here they are not, see
  :mod:`dllm_rl.models.families.mmada`). Rollouts store the offset codes per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from dllm_rl.errors import UserError
from dllm_rl.models.families.mmada import EOI_ID, MMU_ID, SOI_ID
from dllm_rl.models.square_image import square_resize

#: the published image side (32 x 32 = 1024 codes with the published MAGVIT-v2 encoder)
RESOLUTION = 512


def pad_to_square(image: Image.Image, fill: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """``image`` (as RGB) centred on a ``fill`` square whose side is its longer side."""
    image = image.convert("RGB")
    w, h = image.size
    if w == h:
        return image
    side = max(w, h)
    square = Image.new("RGB", (side, side), fill)
    square.paste(image, ((side - w) // 2, (side - h) // 2))
    return square


def image_transform(image: Image.Image, resolution: int = RESOLUTION) -> torch.Tensor:
    """The published MMaDA pixels of ``image``: ``[3, resolution, resolution]`` float32 in [-1, 1]."""
    square = square_resize(image, resolution, (255, 255, 255))  # pad_to_square then resize, without the square
    pixels = torch.from_numpy(np.asarray(square, dtype=np.uint8).copy()).permute(2, 0, 1)
    return pixels.float().div(255).sub(0.5).div(0.5)  # torchvision's ToTensor then Normalize, same float ops


def code_offset(tokenizer) -> int:
    """The published offset of image codes in the prompt ids: the tokenizer's length (its vocabulary and
    added tokens), 126349 for MMaDA's LLaDA tokenizer."""
    return len(tokenizer)


def understanding_ids(codes: torch.Tensor | Sequence[int], chat_ids: Sequence[int], offset: int,
                      vocab_size: int | None = None) -> torch.Tensor:
    """One understanding prompt, ``[<|mmu|>, <|soi|>, codes + offset, <|eoi|>, *chat_ids]`` (1-D int64).

    ``codes`` are one image's MAGVIT-v2 codes (:meth:`dllm_rl.models.magvit.MagvitEncoder.codes`, one row),
    ``offset`` is :func:`code_offset` of the tokenizer the model was trained with, and ``vocab_size`` (the
    model's embedding rows) when given refuses an offset that pushes codes off the vocabulary."""
    codes = torch.as_tensor(codes, dtype=torch.long).flatten().cpu()
    if codes.numel() and int(codes.min()) < 0:
        raise UserError(f"image codes must be >= 0, got {int(codes.min())}")
    image = codes + int(offset)
    if vocab_size is not None and image.numel() and int(image.max()) >= vocab_size:
        raise UserError(f"image code {int(codes.max())} + offset {offset} = {int(image.max())} is outside the "
                        f"model's {vocab_size} vocabulary rows; the offset is len(tokenizer) of the model's "
                        "tokenizer (126349 for MMaDA)")
    head = torch.tensor([MMU_ID, SOI_ID])
    tail = torch.tensor([EOI_ID, *chat_ids], dtype=torch.long)
    return torch.cat([head, image, tail])


__all__ = ["RESOLUTION", "code_offset", "image_transform", "pad_to_square", "understanding_ids"]
