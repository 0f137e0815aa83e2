"""Images in data rows: one function turns whatever a row holds into RGB PIL images.

A row's image value may be

- a path (``str`` or path object), relative to the data file's folder (``base_dir``) unless absolute;
- a ``data:image/...;base64,...`` URI (how a JSONL file embeds image bytes);
- ``bytes`` (a Parquet binary column, an in-memory row);
- a PIL image (what ``datasets`` yields for an ``Image`` feature);
- a dict with ``bytes`` and/or ``path`` (an undecoded ``datasets`` Image feature, or such a column read back
  from Parquet): the bytes when present, else the path.

A column may hold one value or a list of them (an ``images`` column). Every failure is a
:class:`~dllm_rl.tasks.io.DataError` on one line naming the row (file and line / row), the column and what to
do, so a bad image stops a run at load time instead of inside a model.

Every image is bounded before it is decoded (:class:`~dllm_rl.tasks.image_limits.ImageLimits`): the encoded size
first (a file's size, a data URI's length), then the size its header declares; only then are its pixels read.
This is the one way into the project for an image file or bytes: tasks, SFT and DPO rows, evaluation and
``dllm-rl trace --image`` all read through :func:`load_image`.

The prompt marks where each image goes with :data:`IMAGE_PLACEHOLDER` (``<image>``, LLaDA-V's published
placeholder); :func:`with_placeholders` puts them at the start of the user message and
:func:`check_placeholders` refuses a row whose placeholder count differs from its image count.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from .image_limits import ImageLimits, check_encoded, check_size
from .io import DataError

IMAGE_PLACEHOLDER = "<image>"
#: columns an image task looks in, in order, when none is named
IMAGE_COLUMNS = ("image", "images")
_READ_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unreadable(exc: BaseException, what: str, where: str) -> DataError:
    return DataError(f"{where}: {what} is not a readable image ({type(exc).__name__}: {_one_line(exc)}); store it "
                     "as PNG or JPEG")


def _open(source: Any, what: str, where: str, limits: ImageLimits) -> Image.Image:
    """Open ``source`` (a path or a binary stream), check the size its header declares, then decode it as RGB."""
    try:
        with warnings.catch_warnings():
            # Pillow warns (and goes on) between its limit and twice it: check_size refuses those images instead,
            # naming their size (Pillow's limit is one of its checks)
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(source)
    except Image.DecompressionBombError as exc:  # twice Pillow's limit: refused inside Image.open
        raise DataError(f"{where}: {what}: over Pillow's decompression-bomb limit ({_one_line(exc)}); use a smaller "
                        "image") from None
    except _READ_ERRORS as exc:
        raise _unreadable(exc, what, where) from None
    with img:
        check_size(img.width, img.height, limits, what, where)
        try:
            img.load()  # the first frame only, for an animated image
            return img.convert("RGB")
        except _READ_ERRORS as exc:
            raise _unreadable(exc, what, where) from None


def _decode(data: bytes, what: str, where: str, limits: ImageLimits) -> Image.Image:
    check_encoded(len(data), limits, what, where)
    return _open(io.BytesIO(data), what, where, limits)


def _from_path(value: str | os.PathLike, base_dir: Path | None, where: str, limits: ImageLimits) -> Image.Image:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    if not path.is_file():
        folder = "the data file's folder" if base_dir is not None else "the current folder"
        raise DataError(f"{where}: image file {str(value)!r} not found (looked for {path}; relative paths are read "
                        f"from {folder}); fix the path or add the file")
    try:
        check_encoded(path.stat().st_size, limits, f"image file {path}", where)  # before a byte is read
        with path.open("rb") as fh:
            return _open(fh, f"image file {path}", where, limits)
    except OSError as exc:
        raise DataError(f"{where}: image file {path} cannot be read ({type(exc).__name__}: {_one_line(exc)})") \
            from None


def _from_data_uri(value: str, where: str, limits: ImageLimits) -> Image.Image:
    head, _, payload = value.partition(",")
    if not head.endswith(";base64"):
        raise DataError(f"{where}: image data URI {head[:40]!r} is not base64 ('data:image/png;base64,...')")
    # base64 holds 3 bytes per 4 characters: the decoded size is known before decoding
    check_encoded(len(payload) // 4 * 3, limits, "the embedded image", where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DataError(f"{where}: image data URI has invalid base64 ({_one_line(exc)})") from None
    return _decode(data, "the embedded image", where, limits)


def _from_pil(value: Image.Image, where: str, limits: ImageLimits) -> Image.Image:
    """A PIL image handed over (a ``datasets`` Image feature, an in-memory row): its size is checked before it is
    loaded (a lazily opened image) and converted."""
    check_size(value.width, value.height, limits, "the image", where)
    try:
        value.load()
        return value.convert("RGB")
    except _READ_ERRORS as exc:
        raise DataError(f"{where}: the image cannot be decoded ({type(exc).__name__}: {_one_line(exc)})") from None


def load_image(value: Any, base_dir: str | os.PathLike | None = None, where: str = "<row>",
               limits: ImageLimits | None = None) -> Image.Image:
    """One image value (see the module docstring) as an RGB PIL image; ``where`` names the row and column in
    the :class:`DataError` raised when it is missing, cannot be read or is over ``limits`` (default
    :class:`ImageLimits`)."""
    base = Path(base_dir) if base_dir is not None else None
    limits = limits or ImageLimits()
    if isinstance(value, Image.Image):
        return _from_pil(value, where, limits)
    if isinstance(value, bytes | bytearray | memoryview):
        return _decode(bytes(value), "the image bytes", where, limits)
    if isinstance(value, str) and value.startswith("data:"):
        return _from_data_uri(value, where, limits)
    if isinstance(value, str | os.PathLike):
        if not str(value).strip():
            raise DataError(f"{where}: empty image path; give a file path, bytes or an image")
        return _from_path(value, base, where, limits)
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return load_image(value["bytes"], base, where, limits)
        if value.get("path"):
            return _from_path(value["path"], base, where, limits)
        raise DataError(f"{where}: the image has neither bytes nor a path")
    if value is None:
        raise DataError(f"{where}: no image (null); give a file path, bytes or an image")
    raise DataError(f"{where}: a {type(value).__name__} is not an image; give a file path, bytes, a PIL image or a "
                    "{'bytes', 'path'} dict")


def image_values(row: Mapping[str, Any], column: str, where: str) -> list[Any]:
    """The image value(s) of ``row[column]`` as a list (one value, or the column's list); DataError naming the
    row when the column is missing, null or an empty list."""
    if column not in row or row[column] is None:
        have = ", ".join(sorted(map(str, row))) or "none"
        raise DataError(f"{where}: missing image column {column!r} (row has: {have}); add it or name the image "
                        "column with image_column=")
    value = row[column]
    is_list = isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray | memoryview)
    values = list(value) if is_list else [value]
    if not values:
        raise DataError(f"{where}: column {column!r} holds no image (an empty list)")
    return values


def row_images(row: Mapping[str, Any], column: str, base_dir: str | os.PathLike | None = None,
               where: str = "<row>", limits: ImageLimits | None = None) -> list[Image.Image]:
    """Every image of ``row[column]`` (one value or a list) as RGB PIL images, in order, each within ``limits``."""
    values = image_values(row, column, where)
    if len(values) == 1:
        return [load_image(values[0], base_dir, f"{where}: column {column!r}", limits)]
    return [load_image(v, base_dir, f"{where}: column {column!r}[{i}]", limits) for i, v in enumerate(values)]


def placeholder_count(text: str) -> int:
    """How many :data:`IMAGE_PLACEHOLDER` a prompt text holds."""
    return str(text).count(IMAGE_PLACEHOLDER)


def with_placeholders(text: str, n_images: int) -> str:
    """The user message with one ``<image>`` line per image at its start (LLaDA-V's published prompt layout),
    unless the text already places its own placeholders (then it is returned as is)."""
    if placeholder_count(text) or n_images <= 0:
        return text
    return f"{IMAGE_PLACEHOLDER}\n" * n_images + text


def placeholder_images(prompts: Sequence[str], paths: Sequence[str], flag: str = "--image", place: bool = True
                       ) -> tuple[list[str], list[list[Image.Image]]]:
    """The prompts and the image files ``paths`` (read by :func:`load_image`) handed to their ``<image>``
    placeholders in order: ``(prompts, images per prompt)``. With ``place``, one prompt without a placeholder gets
    one per image at its start (:func:`with_placeholders`); a count that does not match is one :class:`UserError`
    line."""
    from dllm_rl.errors import UserError

    prompts = list(prompts)
    if place and len(prompts) == 1 and paths and not placeholder_count(prompts[0]):
        prompts = [with_placeholders(prompts[0], len(paths))]
    wanted = [placeholder_count(p) for p in prompts]
    if sum(wanted) != len(paths):
        raise UserError(f"--prompt texts hold {sum(wanted)} <image> placeholder(s) but {len(paths)} {flag} file(s) "
                        f"were given; give one {flag} per placeholder, in order")
    loaded = [load_image(p, where=f"{flag} {p}") for p in paths]
    out, k = [], 0
    for n in wanted:
        out.append(loaded[k:k + n])
        k += n
    return prompts, out


def check_placeholders(text: str, n_images: int, column: str, where: str) -> None:
    """DataError naming the row when ``text`` does not hold exactly one placeholder per image."""
    k = placeholder_count(text)
    if k != n_images:
        raise DataError(f"{where}: the prompt has {k} {IMAGE_PLACEHOLDER!r} placeholder(s) but column {column!r} "
                        f"holds {n_images} image(s); give one image per placeholder")
