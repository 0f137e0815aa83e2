"""How large an input image may be: :class:`ImageLimits`, checked before anything is allocated.

An image's memory grows with its pixel count (and, where a model pads it to a square, with the square of its long
side), while its file may be tiny: a 138-byte PNG can declare 20000 x 1 pixels, a 20 KB one 13000 x 13000. So the
image loader (:mod:`dllm_rl.tasks.images`) checks, in this order and before decoding any pixel:

1. the encoded size (a file's size from the file system, a data URI's length before base64 decoding, the length
   of raw bytes): ``max_file_mb``;
2. the size the header declares (Pillow reads only the header on open): ``max_side``, ``max_aspect``,
   ``max_pixels``, then Pillow's own decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, 89.5 megapixels
   unless changed), whose warning becomes the same refusal instead of a printed warning (over twice that limit
   Pillow refuses to open the image, and that is the refusal).

The defaults accept every real image the project reads (LLaDA-V's 384 px and ``anyres`` inputs up to its 2304 px
grid, MMaDA's 512 px, photographs up to 40 megapixels, panoramas up to 16384 px wide) and refuse degenerate or
bomb-sized ones. An image task takes other limits as its ``image_limits`` option (a mapping of these fields).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from dllm_rl.config import Checked, field

from .io import DataError

MIB = 2**20


@dataclass
class ImageLimits(Checked):
    """The largest image an image input accepts (see :mod:`dllm_rl.tasks.image_limits`)."""

    max_pixels: int = field(40_000_000, ge=1, help="most pixels (width x height) an image may have (Pillow's own "
                            "decompression-bomb limit, PIL.Image.MAX_IMAGE_PIXELS, applies too)")
    max_side: int = field(16384, ge=1, help="most pixels either side of an image may have")
    max_aspect: float = field(50.0, ge=1, help="largest ratio of an image's long side to its short side")
    max_file_mb: float = field(100.0, gt=0, help="largest encoded image (a file, raw bytes or a data URI's "
                               "decoded bytes), in MiB")

    @property
    def max_bytes(self) -> int:
        return int(self.max_file_mb * MIB)


def as_limits(value: ImageLimits | dict | None, where: str = "image_limits") -> ImageLimits:
    """``value`` as :class:`ImageLimits`: itself, a mapping of its fields (unknown keys and bad values are one
    :class:`~dllm_rl.config.ConfigError` naming ``where``), or the defaults for None."""
    from dllm_rl.config import ConfigError, from_dict

    if value is None:
        return ImageLimits()
    if isinstance(value, ImageLimits):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping of {', '.join(ImageLimits.__dataclass_fields__)}, got "
                          f"{type(value).__name__} {value!r}")
    return from_dict(ImageLimits, value, where)


def check_encoded(n_bytes: int, limits: ImageLimits, what: str, where: str) -> None:
    """DataError naming the row when ``what`` (an encoded image of ``n_bytes``) is over ``max_file_mb``."""
    if n_bytes > limits.max_bytes:
        raise DataError(f"{where}: {what} ({n_bytes / MIB:,.1f} MiB): over the limit of {limits.max_file_mb:g} MiB "
                        "(image_limits.max_file_mb); use a smaller file or raise the limit")


def _size_problem(width: int, height: int, limits: ImageLimits) -> str | None:
    long, short = max(width, height), min(width, height)
    if short < 1:
        return "it has no pixels"
    if long > limits.max_side:
        return f"its {long} px side is over the limit of {limits.max_side} px (image_limits.max_side)"
    if long / short > limits.max_aspect:
        return (f"its aspect ratio {long / short:,.0f}:1 is over the limit of {limits.max_aspect:g}:1 "
                "(image_limits.max_aspect)")
    if width * height > limits.max_pixels:
        return f"its {width * height:,} pixels are over the limit of {limits.max_pixels:,} (image_limits.max_pixels)"
    cap = Image.MAX_IMAGE_PIXELS
    if cap and width * height > cap:
        return f"its {width * height:,} pixels are over Pillow's decompression-bomb limit of {cap:,}"
    return None


def check_size(width: int, height: int, limits: ImageLimits, what: str, where: str) -> None:
    """DataError naming the row when an image of ``width`` x ``height`` (its header's size) is over a limit."""
    problem = _size_problem(width, height, limits)
    if problem:
        raise DataError(f"{where}: {what} ({width}x{height} px): {problem}; use a smaller image or raise the limit")


__all__ = ["ImageLimits", "as_limits", "check_encoded", "check_size"]
