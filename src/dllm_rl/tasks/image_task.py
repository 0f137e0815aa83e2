"""Tasks whose rows carry images: the column, the folder relative paths are read from, and the prompt check.

:class:`ImageTask` sits between :class:`~dllm_rl.tasks.base.Task` and a task's text rules. For every row it

1. finds the image column (``image_column=``; by default ``image``, else ``images``, fixed by the first row and
   exposed as :attr:`ImageTask.image_column` after loading);
2. builds the text prompt as the task does, then puts one ``<image>`` line per image at the start of the user
   message (unless the question places its own placeholders) and refuses the row when the placeholder count
   differs from the image count;
3. decodes each image once (:func:`~dllm_rl.tasks.images.row_images`), so a missing, unreadable or too large
   image (over ``image_limits``, :class:`~dllm_rl.tasks.image_limits.ImageLimits`, checked before decoding) stops
   the load with one line naming the file, row and column, before any model runs. The decoded pixels are not
   kept: :meth:`ImageTask.images` decodes them again when a model needs them, so examples stay small.

Relative image paths are read from the data file's folder (the current folder for in-memory rows and hub
datasets, whose ``datasets`` Image features carry their bytes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from .base import DataError, Task, is_hf_name
from .image_limits import ImageLimits, as_limits
from .images import IMAGE_COLUMNS, check_placeholders, image_values, row_images, with_placeholders


class ImageTask(Task):
    """A task over rows with one or more images (see the module docstring).

    Extra args: ``image_column`` (the column holding the image or the list of images; default ``image``, else
    ``images``) and ``image_limits`` (the largest image accepted: an :class:`ImageLimits` or a mapping of its
    fields; default :class:`ImageLimits`)."""

    def __init__(self, data: Any = None, *, image_column: str | None = None,
                 image_limits: ImageLimits | dict | None = None, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.image_column = image_column
        self.image_limits = as_limits(image_limits)

    @property
    def image_dir(self) -> Path | None:
        """The folder relative image paths are read from: the data file's folder (None: the current folder)."""
        src: Any = self.data
        if src is None:
            try:
                src = self.default_data()
            except FileNotFoundError:
                return None
        if isinstance(src, str | os.PathLike) and not is_hf_name(str(src)):
            return Path(src).expanduser().resolve().parent
        return None

    def _column(self, row: Mapping[str, Any], where: str) -> str:
        if self.image_column is not None:
            return self.image_column
        for col in IMAGE_COLUMNS:
            if row.get(col) is not None:
                self.image_column = col
                return col
        have = ", ".join(sorted(map(str, row))) or "none"
        raise DataError(f"{where}: no image column ({' or '.join(map(repr, IMAGE_COLUMNS))}) in the row (row has: "
                        f"{have}); add one or name it with image_column=")

    def prepare(self, row: dict[str, Any], where: str = "<row>") -> dict[str, Any] | None:
        """The text task's example, with the image placeholders in its prompt and every image checked."""
        column = self._column(row, where)
        n = len(image_values(row, column, where))
        ex = super().prepare(row, where)
        if ex is None:
            return None
        ex["prompt"] = with_placeholders(ex["prompt"], n)
        check_placeholders(ex["prompt"], n, column, where)
        row_images(ex, column, self.image_dir, where, self.image_limits)
        return ex

    def images(self, example: Mapping[str, Any]) -> list[Image.Image]:
        """The example's images as RGB PIL images, one per ``<image>`` placeholder of its prompt, in order."""
        column = self.image_column or next((c for c in IMAGE_COLUMNS if example.get(c) is not None), IMAGE_COLUMNS[0])
        return row_images(example, column, self.image_dir, "example", self.image_limits)
