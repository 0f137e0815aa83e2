"""Prompts with images as a model takes them: token ids, and for LLaDA-V the features spliced into them.

An image task's prompt text holds one ``<image>`` placeholder per image (:mod:`dllm_rl.tasks.images`). What a
placeholder becomes depends on the family, as the published rollout and training code feeds images:

- ``llada_v``: the text is split at the placeholders and each piece tokenized alone (the published
  ``tokenizer_image_token``), with :data:`~dllm_rl.models.llava_images.IMAGE_TOKEN_INDEX` between the pieces;
  :func:`~dllm_rl.models.llava_images.prompt_images` then widens each placeholder to its image's positions and
  returns the :class:`~dllm_rl.models.prompt_images.PromptImages` (the tower runs once per distinct image).
- ``mmada``: the image becomes prompt ids, ``[<|mmu|>, <|soi|>, codes + len(tokenizer), <|eoi|>, text ids]``
  (:func:`~dllm_rl.models.mmada_image.understanding_ids`; the placeholder and the newline after it are removed
  from the text). The codes come from the MAGVIT-v2 encoder (:mod:`dllm_rl.models.magvit`), run once per
  distinct image. One image per prompt, as the published understanding prompt has.
- any other family: a prompt with an image is refused (:func:`refuse_images`, one line naming the family).

:class:`PromptEncoder` is the one way from prompt text and images to prompt ids (and LLaDA-V's features), for
training, RL and evaluation alike; :meth:`PromptEncoder.task_prompts` does it for a task's examples. A rollout
group encodes its prompt once: encode the distinct examples, then repeat rows (:func:`repeat_rows`).
:func:`image_spans` says where each encoded prompt's image sits (the trace viewer draws it there).

Where MMaDA's VQ checkpoint is: :class:`ImageInputConfig` ``vq_model`` (a directory), else the ``vq_model/``
folder inside the model's directory. Its ``config.json`` (optional) gives the encoder's sizes
(:class:`~dllm_rl.models.magvit.MagvitConfig` fields) and ``resolution`` (the image side, published 512); without
one the published sizes apply.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from dllm_rl.config import Checked, field
from dllm_rl.errors import UserError
from dllm_rl.models.diffusion_lm import DiffusionLM
from dllm_rl.models.prompt_images import PromptImages

IMAGE_PLACEHOLDER = "<image>"  # the task layer's placeholder (dllm_rl.tasks.images), repeated to keep this cheap
IMAGE_FAMILIES = ("llada_v", "mmada")
#: the most images one prompt of a family holds (a family not named: any number)
MAX_IMAGES = {"mmada": 1}
VQ_FOLDER = "vq_model"
_STRIP = re.compile(re.escape(IMAGE_PLACEHOLDER) + r"\n?")


@dataclass
class ImageInputConfig(Checked):
    """How prompts with images reach a model (see :mod:`dllm_rl.models.image_inputs`)."""

    vq_model: str = field(
        "", help="MMaDA: the MAGVIT-v2 checkpoint directory (showlab/magvitv2 layout) that turns images into "
        "prompt codes; empty: the vq_model/ folder inside the model's directory")


def takes_images(family_name: str) -> bool:
    """Whether a model of ``family_name`` reads images (:data:`IMAGE_FAMILIES`)."""
    return family_name in IMAGE_FAMILIES


def max_images(family_name: str) -> int | None:
    """The most images one prompt of a ``family_name`` model holds (None: no limit; 0: a text-only family)."""
    return MAX_IMAGES.get(family_name) if takes_images(family_name) else 0


def refuse_images(family_name: str, what: str) -> None:
    """The one-line error for images given to a text-only family; ``what`` says where they came from, verb
    included (``"task 'shapes' has images"``, ``"the prompts carry images"``)."""
    if not takes_images(family_name):
        raise UserError(f"{what}, but a {family_name} model reads text only; use a model of an image family "
                        f"({', '.join(IMAGE_FAMILIES)}) or a text task")


def image_key(image: Image.Image) -> tuple:
    """What makes two images the same input: mode, size and pixel bytes."""
    return image.mode, image.size, hashlib.blake2b(image.tobytes(), digest_size=16).digest()


def _vq_sizes(path: Path) -> tuple[Any, int]:
    """The :class:`MagvitConfig` and image side of the VQ checkpoint ``path`` (its optional config.json)."""
    from dllm_rl.models.magvit import MagvitConfig
    from dllm_rl.models.mmada_image import RESOLUTION

    file = path / "config.json"
    raw = json.loads(file.read_text()) if file.is_file() else {}
    names = {f.name for f in fields(MagvitConfig)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
    return MagvitConfig(**kw), int(raw.get("resolution", RESOLUTION))


def save_vq(encoder: Any, path: str | Path, resolution: int) -> Path:
    """Write a MAGVIT-v2 encoder where :class:`PromptEncoder` finds it: ``model.safetensors`` under the published
    tensor names and a config.json with its sizes and ``resolution``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()}, str(path / "model.safetensors"))
    cfg = {f.name: getattr(encoder.cfg, f.name) for f in fields(encoder.cfg)}
    (path / "config.json").write_text(json.dumps({**cfg, "resolution": int(resolution)}, indent=2) + "\n")
    return path


def copy_vq(model_dir: str | Path | None, out_dir: str | Path) -> None:
    """Copy the ``vq_model/`` folder of ``model_dir`` (when it has one) into a saved model ``out_dir``, so that the
    saved MMaDA model reads images as the one it was trained from."""
    if model_dir is None or not (Path(model_dir) / VQ_FOLDER).is_dir():
        return
    shutil.copytree(Path(model_dir) / VQ_FOLDER, Path(out_dir) / VQ_FOLDER, dirs_exist_ok=True)


class PromptEncoder:
    """Turns prompt texts with ``<image>`` placeholders and their images into what ``generate`` and the
    estimators take, for the models of one run (see the module docstring). ``model_dir``: the model's
    checkpoint directory (MMaDA's default VQ location); ``config``: :class:`ImageInputConfig`; ``train_vision``:
    LLaDA-V's image parts that train (:data:`~dllm_rl.models.llava_images.TRAIN_VISION`; SFT's option, none
    elsewhere)."""

    def __init__(self, tokenizer: Any, model_dir: str | Path | None = None, config: ImageInputConfig | None = None,
                 train_vision: str = "none"):
        self.tokenizer = tokenizer
        self.train_vision = train_vision  # LLaDA-V: which image parts the features' graph reaches (SFT)
        self.model_dir = model_dir
        self.config = config or ImageInputConfig()
        self._vq: tuple[Any, int] | None = None

    # ------------------------------------------------------------------------------------ tasks
    def task_prompts(self, model: DiffusionLM, task: Any, examples: Sequence[dict]
                     ) -> tuple[list[str], list[list[int]], PromptImages | None]:
        """The prompt texts of ``examples``, their ids, and (LLaDA-V) their images' splice; a task without images
        (no ``images`` method) gives plain token ids."""
        texts = [task.build_prompt(ex, self.tokenizer) for ex in examples]
        images = [task.images(ex) for ex in examples] if hasattr(task, "images") else None
        ids, pim = self.encode(model, texts, images)
        return texts, ids, pim

    def encode(self, model: DiffusionLM, texts: Sequence[str], images: Sequence[Sequence[Image.Image]] | None
               ) -> tuple[list[list[int]], PromptImages | None]:
        """Prompt ids of ``texts`` (``images[i]``: prompt ``i``'s images, one per placeholder, in order) and the
        :class:`PromptImages` of a LLaDA-V model (``None`` for every other family)."""
        if images is None or not any(images):
            return [self._tokens(t) for t in texts], None
        family = model.family.name
        refuse_images(family, "the prompts carry images")
        if family == "llada_v":
            return self._llada_v(model, texts, images)
        return self._mmada(model, texts, images), None

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _llada_v(self, model: DiffusionLM, texts, images) -> tuple[list[list[int]], PromptImages]:
        from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images

        ids = []
        for text in texts:
            pieces = str(text).split(IMAGE_PLACEHOLDER)
            row = self._tokens(pieces[0])
            for piece in pieces[1:]:
                row += [IMAGE_TOKEN_INDEX, *self._tokens(piece)]
            ids.append(row)
        return prompt_images(model, ids, [list(x) for x in images], self.train_vision)

    def _mmada(self, model: DiffusionLM, texts, images) -> list[list[int]]:
        from dllm_rl.models.mmada_image import code_offset, image_transform, understanding_ids

        encoder, resolution = self.vq(model.device)
        index: dict[tuple, int] = {}
        distinct: list[Image.Image] = []
        for i, (text, imgs) in enumerate(zip(texts, images)):
            if len(imgs) > MAX_IMAGES["mmada"]:
                raise UserError(f"prompt {i} has {len(imgs)} images; MMaDA's understanding prompt holds one image")
            k = str(text).count(IMAGE_PLACEHOLDER)
            if k != len(imgs):
                raise UserError(f"prompt {i} has {k} {IMAGE_PLACEHOLDER!r} placeholder(s) but {len(imgs)} image(s); "
                                "give one image per placeholder")
            for img in imgs:
                index.setdefault(image_key(img), len(distinct))
                if len(index) > len(distinct):
                    distinct.append(img)
        pixels = torch.stack([image_transform(img, resolution) for img in distinct]).to(model.device)
        codes = encoder.codes(pixels).cpu()
        offset, vocab = code_offset(self.tokenizer), int(model.config.vocab_size)
        out = []
        for text, imgs in zip(texts, images):
            chat = self._tokens(_STRIP.sub("", str(text)))
            if not imgs:
                out.append(chat)
                continue
            out.append(understanding_ids(codes[index[image_key(imgs[0])]], chat, offset, vocab).tolist())
        return out

    def vq(self, device: Any) -> tuple[Any, int]:
        """MMaDA's MAGVIT-v2 encoder and image side, loaded once: from :class:`ImageInputConfig` ``vq_model``, else
        the ``vq_model/`` folder of the model directory (the published recipes name the folder in their own config,
        ``vq_model_path``; a checkpoint directory here carries it, so that one path is the whole model)."""
        if self._vq is None:
            from dllm_rl.models.magvit import load_vq_encoder

            where = self.config.vq_model or (str(Path(self.model_dir) / VQ_FOLDER) if self.model_dir else "")
            if not where or not Path(where).is_dir():
                raise UserError(f"MMaDA reads images through a MAGVIT-v2 VQ encoder, and none was found "
                                f"({where or 'no model directory'}): put the showlab/magvitv2 checkpoint in the "
                                f"model's {VQ_FOLDER}/ folder or set vq_model")
            cfg, resolution = _vq_sizes(Path(where))
            self._vq = (load_vq_encoder(where, cfg, device=device), resolution)
        return self._vq


def repeat_rows(ids: list[list[int]], images: PromptImages | None, times: int
                ) -> tuple[list[list[int]], PromptImages | None]:
    """Each prompt ``times`` times in a row (a rollout group), the images' features shared, not recomputed."""
    rows = [i for i in range(len(ids)) for _ in range(times)]
    return [ids[i] for i in rows], images.select(rows) if images is not None else None


def image_spans(model: DiffusionLM, prompt_ids: Sequence[Sequence[int]], images: PromptImages | None
                ) -> list[list[tuple[int, int]]]:
    """``(offset, length)`` of each image's run in each prompt (:meth:`PromptEncoder.encode`'s output):
    LLaDA-V's spliced features, MMaDA's codes between ``<|soi|>`` and ``<|eoi|>``; ``[]`` for a prompt without
    an image."""
    if images is not None:
        return [images.spans(b) for b in range(len(images))]
    if model.family.name != "mmada":
        return [[] for _ in prompt_ids]
    from dllm_rl.models.families.mmada import EOI_ID, SOI_ID

    out = []
    for ids in prompt_ids:
        ids = list(ids)
        if SOI_ID in ids and EOI_ID in ids[ids.index(SOI_ID):]:
            s = ids.index(SOI_ID) + 1
            out.append([(s, ids.index(EOI_ID, s) - s)])
        else:
            out.append([])
    return out


__all__ = ["IMAGE_FAMILIES", "VQ_FOLDER", "ImageInputConfig", "PromptEncoder", "copy_vq", "image_key",
           "image_spans", "max_images", "refuse_images", "repeat_rows", "save_vq", "takes_images"]
