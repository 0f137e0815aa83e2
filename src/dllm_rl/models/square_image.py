"""An image padded to a square and resized, without building the square at full size.

LLaDA-V (``pad``: gray, 384 px) and MMaDA (white, 512 px) both centre the image on a square of its long side, then
resize the square with Pillow's bicubic filter. Built as published, the square of a 20000 x 1 image holds 400
million pixels. :func:`square_resize` gives the same pixels from strips no wider than the long side:

Pillow resizes in two passes, horizontal then vertical, rounding to 8 bits between them, and each output pixel of
a pass depends only on its own row (column) of input. So for a wide image the padding rows of the square become
one resized fill row, and only the image's own rows go through the horizontal pass; a tall image's rows go through
it in strips (padded to the square's width, a few MiB at a time: the published amount of work, about a second
for a 16384 px tall image, without its memory). The vertical pass then runs on ``side x long`` pixels. The result
equals the published pad-then-resize bit for bit (``tests/models/test_square_image.py``).
Hand-written because no library offers a pad-and-resize that keeps the published pixels without the square.
"""

from __future__ import annotations

from PIL import Image

_BICUBIC = Image.Resampling.BICUBIC
_STRIP_BYTES = 1 << 24  # a tall image's padded strips: at most 16 MiB each


def square_resize(image: Image.Image, side: int, fill: tuple[int, int, int]) -> Image.Image:
    """``image`` (RGB) centred on a ``fill`` square of its long side (``(long - short) // 2`` before), resized to
    ``side`` x ``side`` with bicubic resampling: the published pixels, in memory linear in the long side."""
    image = image.convert("RGB")
    w, h = image.size
    if w == h:
        return image.resize((side, side), _BICUBIC)
    long = max(w, h)
    if w > h:  # the square adds rows: they are all one resized fill row
        fill_row = Image.new("RGB", (long, 1), fill).resize((side, 1), _BICUBIC)
        rows = fill_row.resize((side, long), Image.Resampling.NEAREST)
        rows.paste(image.resize((side, h), _BICUBIC), (0, (long - h) // 2))
    else:  # the square adds columns: every row is padded, a strip of rows at a time
        rows = Image.new("RGB", (side, h))
        step, left = max(1, _STRIP_BYTES // (3 * long)), (long - w) // 2
        for top in range(0, h, step):
            k = min(step, h - top)
            strip = Image.new("RGB", (long, k), fill)
            strip.paste(image.crop((0, top, w, top + k)), (left, 0))
            rows.paste(strip.resize((side, k), _BICUBIC), (0, top))
    return rows.resize((side, side), _BICUBIC)  # the vertical pass (a copy when long == side)


__all__ = ["square_resize"]
