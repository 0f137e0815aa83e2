"""Chat content as OpenAI and vLLM send it: a message's ``content`` is a string or a list of parts, ``{"type":
"text", "text": ...}`` and ``{"type": "image_url", "image_url": {"url": ...}}``.

:func:`flatten` turns the messages into plain-text ones for the chat template: an image part becomes the image
placeholder (``<image>``, :data:`~dllm_rl.tasks.images.IMAGE_PLACEHOLDER`) where it stands, and a message's parts
are joined with a newline (as vLLM joins text parts), so ``[image, "colour circle"]`` reads ``"<image>\\ncolour
circle"``, the image tasks' prompt layout. The rendered prompt then goes through the same
:class:`~dllm_rl.models.image_inputs.PromptEncoder` as the tasks (LLaDA-V's features spliced at the placeholder,
MMaDA's codes in its understanding prompt).

:func:`fetch_image` reads an ``image_url`` through the tasks' bounded loader (:func:`~dllm_rl.tasks.images.load_image`:
sizes checked before any pixel is decoded): a ``data:image/...;base64,...`` URI always; a local file (``file:`` URL
or plain path) only inside the server's ``--allowed-local-media-path`` folder, symlinks resolved first; an http(s)
URL never (the server fetches nothing over the network).

Every refusal is a :class:`MediaError` naming the part (``messages[0].content[1]``), which the app answers 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from PIL import Image

from dllm_rl.models.image_inputs import IMAGE_FAMILIES, max_images, takes_images
from dllm_rl.tasks.image_limits import ImageLimits
from dllm_rl.tasks.images import IMAGE_PLACEHOLDER, load_image
from dllm_rl.tasks.io import DataError

PART_TYPES = ("text", "image_url")


class MediaError(ValueError):
    """A message's content or image the server cannot take; the message names the part."""


def _image_url(part: dict[str, Any], where: str) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value  # the object OpenAI sends, or a bare string
    if not isinstance(url, str) or not url:
        raise MediaError(f"{where}.image_url: give {{\"url\": \"data:image/png;base64,...\"}}")
    return url


def _part_text(part: Any, where: str, family: str, urls: list[tuple[str, str]]) -> str:
    if not isinstance(part, dict) or part.get("type") not in PART_TYPES:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise MediaError(f"{where}: a part of type {kind!r} is not taken; give 'text' or 'image_url' parts")
    if part["type"] == "text":
        if not isinstance(part.get("text"), str):
            raise MediaError(f"{where}.text: a text part needs a string 'text'")
        return _text(part["text"], where, family)
    if not takes_images(family):
        raise MediaError(f"{where}: an image for a {family} model, which reads text only; send text, or serve a "
                         f"model of an image family ({', '.join(IMAGE_FAMILIES)})")
    urls.append((_image_url(part, where), where))
    return IMAGE_PLACEHOLDER


def _text(text: str, where: str, family: str) -> str:
    if takes_images(family) and IMAGE_PLACEHOLDER in text:
        raise MediaError(f"{where}: the text holds {IMAGE_PLACEHOLDER!r}, which marks an image for a {family} "
                         "model, without an image; send the image as an image_url part (it takes the "
                         "placeholder's place)")
    return text


def flatten(messages: Sequence[dict[str, Any]], family: str) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    """The messages with string contents (see the module docstring), and each image part's ``(url, where)`` in
    order; :class:`MediaError` for a part a ``family`` model cannot take or more images than it takes."""
    out, urls = [], []
    for i, message in enumerate(messages):
        content, where = message.get("content"), f"messages[{i}].content"
        if content is None:
            content = ""  # an assistant turn with tool calls only, as OpenAI allows
        if isinstance(content, str):
            text = _text(content, where, family)
        else:
            text = "\n".join(_part_text(p, f"{where}[{j}]", family, urls) for j, p in enumerate(content))
        out.append({**message, "content": text})
    most = max_images(family)
    if most is not None and len(urls) > most:
        raise MediaError(f"messages: {len(urls)} images, but a {family} model takes at most {most} per prompt")
    return out, urls


def _local_path(url: str, where: str, allowed: str | None) -> Path:
    """The file a ``file:`` URL or plain path names, resolved (symlinks followed), inside ``allowed``."""
    if not allowed:
        raise MediaError(f"{where}: local files are not read unless the server is started with "
                         "--allowed-local-media-path DIR (a folder whose files requests may name); send the image "
                         "as a data URI (data:image/png;base64,...)")
    raw = unquote(urlparse(url).path) if url.startswith("file:") else url
    root = Path(allowed).expanduser().resolve()
    path = Path(raw).expanduser()
    path = (path if path.is_absolute() else root / path).resolve()
    # the messages name what the client sent, never the server's own folders
    if not path.is_relative_to(root):
        raise MediaError(f"{where}: {url!r} is outside the server's --allowed-local-media-path folder")
    if not path.is_file():
        raise MediaError(f"{where}: {url!r}: no such file in the server's --allowed-local-media-path folder")
    return path


def fetch_image(url: str, where: str, allowed: str | None = None, limits: ImageLimits | None = None
                ) -> Image.Image:
    """The image an ``image_url`` names, as RGB, through the tasks' bounded loader (see the module docstring)."""
    scheme = urlparse(url).scheme.lower() if ":" in url[:12] else ""
    try:
        if scheme == "data":
            if not url.startswith("data:image/"):
                raise MediaError(f"{where}: {url[:40]!r} is not an image data URI (data:image/png;base64,...)")
            return load_image(url, where=where, limits=limits)
        if scheme in ("http", "https"):
            raise MediaError(f"{where}: {url[:80]!r}: http(s) URLs are not fetched (the server reads no network); "
                             "send the image as a data URI (data:image/png;base64,...)")
        if scheme not in ("", "file") and len(scheme) > 1:  # one letter: a Windows drive, a path
            raise MediaError(f"{where}: the URL scheme {scheme!r} is not read; send a data URI "
                             "(data:image/png;base64,...)")
        return load_image(_local_path(url, where, allowed), where=where, limits=limits)
    except DataError as err:
        raise MediaError(str(err)) from None


__all__ = ["MediaError", "fetch_image", "flatten"]
