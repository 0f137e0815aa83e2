"""Images whose header declares many pixels while the file stays small: what the image limits must refuse.

:func:`zero_png` writes a real, complete PNG (every pixel black, 1 bit each) by hand with ``zlib``, a block of rows
at a time: Pillow keeps a 1-bit image at one byte per pixel, so drawing a 13000 x 13000 one with Pillow would take
169 MB, while this takes 1 MiB of memory and ~20 KB of file.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def zero_png(width: int, height: int, path: str | Path | None = None) -> bytes:
    """A ``width`` x ``height`` all-black 1-bit grayscale PNG (written to ``path`` when given); its bytes."""
    row = b"\0" * (1 + (width + 7) // 8)  # filter type 0, then the packed pixels
    per_block = max(1, (1 << 20) // len(row))
    comp, parts, left = zlib.compressobj(9), [], height
    while left:
        n = min(left, per_block)
        parts.append(comp.compress(row * n))
        left -= n
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # bit depth 1, grayscale, no interlace
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", b"".join(parts)) + _chunk(b"IEND", b"")
    if path is not None:
        Path(path).write_bytes(data)
    return data
