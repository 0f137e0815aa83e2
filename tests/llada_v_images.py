"""What the LLaDA-V tests share (sampling, estimators, models): the tiny published-layout checkpoint of
``tests/models/fixtures/llada_v`` (its README says how it was made) and the test images drawn from arithmetic on the
pixel grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dllm_rl.models import DiffusionLM, load_model

LLADA_V = Path(__file__).parent / "models" / "fixtures" / "llada_v"


def pattern(width: int, height: int, seed: int) -> Image.Image:
    """An RGB test image from arithmetic on the pixel grid (no randomness; the fixture README names it)."""
    y, x = np.mgrid[0:height, 0:width]
    chans = [(x * 7 + y * 13 + seed) % 256, (x * y + seed * 31) % 251, (x + 3 * y + (x // 7) * (y // 5)) % 256]
    return Image.fromarray(np.stack(chans, -1).astype(np.uint8))


def sharp_llada_v() -> DiffusionLM:
    """The tiny LLaDA-V with "pad" images (729 patches + 1 newline = 730 positions each) and its head scaled by 8,
    so that decoding confidences lie far apart (the sampler's and estimators' tests compare exact orders)."""
    model = load_model(LLADA_V)
    model.published_config["image_aspect_ratio"] = "pad"
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model
