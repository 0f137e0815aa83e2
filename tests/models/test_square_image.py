"""Pad-and-resize without the full-size square (``square_resize``): the same pixels as the published
pad-then-resize, for LLaDA-V's ``pad`` path and MMaDA's transform, on images of every aspect; and the square of a
long, thin image is never allocated."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import torch
from llada_v_images import LLADA_V, pattern
from PIL import Image
from transformers import LlavaOnevisionImageProcessorPil, SiglipImageProcessorPil

from dllm_rl.models.llava_images import preprocess
from dllm_rl.models.mmada_image import image_transform, pad_to_square
from dllm_rl.models.square_image import square_resize

GRAY, WHITE = (127, 127, 127), (255, 255, 255)
#: (width, height): wide and tall, down- and up-sampled, odd sides, a near square, a square, one pixel thin
SIZES = [(90, 50), (50, 90), (384, 200), (200, 384), (1000, 700), (700, 1000), (31, 7), (7, 31), (500, 499),
         (384, 384), (3000, 40), (40, 3000), (1, 5), (5, 1)]


def published_square(image: Image.Image, side: int, fill) -> Image.Image:
    """The rule as published: the whole square of the long side, the image centred on it, then one resize."""
    w, h = image.size
    long = max(w, h)
    square = Image.new("RGB", (long, long), fill)
    square.paste(image, ((long - w) // 2, (long - h) // 2))
    return square.resize((side, side), Image.Resampling.BICUBIC)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_square_resize_equals_pad_then_resize(size):
    img = pattern(*size, seed=sum(size))
    for side, fill in ((384, GRAY), (512, WHITE), (48, GRAY)):
        got, want = np.asarray(square_resize(img, side, fill)), np.asarray(published_square(img, side, fill))
        assert got.shape == (side, side, 3)
        assert np.array_equal(got, want), f"{size} -> {side}: {(got != want).sum()} values differ"


def test_llada_v_pad_pixels_are_the_published_processors():
    """``preprocess`` (pad) against the transformers processors fed the full gray square, as it used to run."""
    pub = {**json.loads((LLADA_V / "config.json").read_text()), "image_aspect_ratio": "pad"}
    mean = std = (0.5, 0.5, 0.5)
    tiler = LlavaOnevisionImageProcessorPil(image_mean=mean, image_std=std, size={"height": 384, "width": 384},
                                            do_pad=False)
    resizer = SiglipImageProcessorPil(image_mean=mean, image_std=std, size={"height": 384, "width": 384})
    images = [pattern(w, h, seed=w) for w, h in ((90, 50), (50, 90), (640, 480), (300, 900), (384, 384), (7, 300))]
    pixels, sizes = preprocess(images, pub)
    for img, px in zip(images, pixels):
        square = tiler.pad_to_square(np.asarray(img).transpose(2, 0, 1), background_color=GRAY)
        old = resizer(square, input_data_format="channels_first", return_tensors="pt")["pixel_values"].float()
        assert px.shape == (1, 3, 384, 384)
        assert torch.equal(px, old), img.size
    assert sizes == [(img.height, img.width) for img in images]


def test_mmada_transform_is_the_published_pad_then_resize():
    for w, h in ((90, 50), (50, 90), (700, 300), (16, 16)):
        img = pattern(w, h, seed=h)
        square = pad_to_square(img).resize((512, 512), Image.Resampling.BICUBIC)
        old = torch.from_numpy(np.asarray(square).copy()).permute(2, 0, 1).float().div(255).sub(0.5).div(0.5)
        assert torch.equal(image_transform(img, 512), old), (w, h)


def _spy_new(monkeypatch) -> list[int]:
    """The pixel count of every image Pillow's ``Image.new`` makes from now on."""
    made: list[int] = []
    real_new = Image.new

    def new(mode, dims, *args, **kw):
        made.append(dims[0] * dims[1])
        return real_new(mode, dims, *args, **kw)

    monkeypatch.setattr(Image, "new", new)
    return made


@pytest.mark.parametrize("size", [(8000, 2), (2, 8000)], ids=["wide", "tall"])
def test_the_square_of_a_thin_image_is_never_built(size, monkeypatch):
    """The published square of an 8000 px long image holds 64 million pixels. LLaDA-V's pad path allocates no
    array near it (it used to pad a numpy array to the square), and MMaDA's transform no image (it pasted onto a
    Pillow square): at most the long side times the output side, or a 16 MiB strip."""
    img = pattern(*size, seed=1)
    pub = {**json.loads((LLADA_V / "config.json").read_text()), "image_aspect_ratio": "pad"}
    tracemalloc.start()
    try:
        pixels, _ = preprocess([img], pub)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pixels[0].shape == (1, 3, 384, 384) and peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB"
    made = _spy_new(monkeypatch)
    assert image_transform(img, 512).shape == (3, 512, 512)
    assert made and max(made) <= max(512 * 8000, 2**24 // 3), max(made)
    out = square_resize(img, 384, GRAY)
    assert out.getpixel((0, 0)) == GRAY and out.getpixel((192, 192)) != GRAY
