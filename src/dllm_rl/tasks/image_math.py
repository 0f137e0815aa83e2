"""Math over an image (MMK12 style): the question and its figure, a boxed answer checked by math-verify.

Data: ``question`` (or ``problem``), the image(s) (``image`` / ``images``, see
:mod:`dllm_rl.tasks.image_task`) and ``answer`` (or a ``solution`` whose last ``\\boxed{}`` is the answer).
Default data: ``hf:FanqingM/MMK12`` (splits ``train`` and ``test``).

Prompt: ``<image>`` at the start of the user message, the question, then the boxed-answer instruction.
Answer extraction and reward are :class:`~dllm_rl.tasks.math_task.MathTask`'s: the last complete ``\\boxed{}``,
verified against the reference with math-verify in worker processes (an identical answer skips the verifier).
"""

from __future__ import annotations

from typing import ClassVar

from .image_task import ImageTask
from .math_task import MathTask


class ImageMathTask(ImageTask, MathTask):
    """:class:`MathTask` whose rows carry images (see the module docstring)."""

    name: ClassVar[str] = "image_math"
    default_files: ClassVar = {}
    hub_datasets: ClassVar = {"train": "hf:FanqingM/MMK12@train", "test": "hf:FanqingM/MMK12@test"}
