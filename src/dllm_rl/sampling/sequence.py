"""One request's decoding state in the continuous-batching engine: its own one-row canvas, random stream, step
counter and trace, so what it decodes depends on nothing but itself.

The canvas is :func:`~dllm_rl.sampling.canvas.build_canvas` of the one prompt: exactly the layout
:func:`~dllm_rl.sampling.generate` uses for that prompt alone (no padding: column = position), decoded block by
block with the same rules (:mod:`dllm_rl.sampling.decode`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import Canvas, build_canvas
from dllm_rl.sampling.config import DecodeConfig


@dataclass
class Sequence:
    """A request being decoded (see the module docstring)."""

    request_id: int
    canvas: Canvas  # one row
    generator: torch.Generator
    step_map: torch.Tensor  # [T] long, -1 = not generated
    conf_map: torch.Tensor  # [T] float32
    entropy_map: torch.Tensor  # [T] float32
    block_idx: int = 0  # the decoded block being worked on
    local_step: int = 0  # steps spent on it (static schedule counts)
    masked0: int = 0  # masks it held when it began
    nfe: int = 0
    cached: int = 0  # block models: columns [0, cached) are in the slot's cache
    slot: int = -1
    config: DecodeConfig | None = None  # its decoding rules (the engine's, or the request's own)
    images: PromptImages | None = None  # LLaDA-V: its prompt's images (one row; the prompt starts at column 0)

    @classmethod
    def new(cls, request_id: int, prompt: list[int], gen_length: int, block: int, block_causal: bool, mask_id: int,
            pad_id: int, device, seed: int, images: PromptImages | None = None) -> Sequence:
        # no splice on the canvas: the engine splices a step's rows from their images at the step's own columns
        canvas = build_canvas([prompt], gen_length, block, block_causal, mask_id, pad_id, device)
        width = canvas.x.shape[1]
        seq = cls(request_id, canvas, torch.Generator(device=device).manual_seed(int(seed)),
                  torch.full((width,), -1, dtype=torch.long, device=device),
                  torch.zeros(width, dtype=torch.float32, device=device),
                  torch.zeros(width, dtype=torch.float32, device=device))
        seq.images = images
        seq.begin_block()
        return seq

    @property
    def x(self) -> torch.Tensor:
        return self.canvas.x[0]

    @property
    def todo(self) -> torch.Tensor:
        return self.canvas.todo[0]

    @property
    def width(self) -> int:
        return int(self.canvas.x.shape[1])

    def cols(self) -> tuple[int, int]:
        return self.canvas.cols(self.block_idx)

    def begin_block(self) -> None:
        s, e = self.cols()
        self.local_step, self.masked0 = 0, int(self.todo[s:e].sum())

    def commit(self, cols: torch.Tensor, tokens: torch.Tensor, conf: torch.Tensor, entropy: torch.Tensor) -> None:
        """Commit ``tokens`` at canvas columns ``cols`` with their confidences and entropies; one more step spent."""
        self.x[cols] = tokens
        self.todo[cols] = False
        self.step_map[cols] = self.nfe
        self.conf_map[cols] = conf.float()
        self.entropy_map[cols] = entropy.float()
        self.nfe += 1
        self.local_step += 1

    def answer_ended(self, eos: int) -> bool:
        """Whether the answer is decided: a committed EOS with every completion slot before it committed (slots after
        the first EOS lie outside the answer, ``Rollout.completion_mask``)."""
        c0, c1 = int(self.canvas.comp_start[0]), int(self.canvas.comp_end[0])
        is_eos = (self.x[c0:c1] == eos) & ~self.todo[c0:c1]
        if not bool(is_eos.any()):
            return False
        first = int(is_eos.int().argmax())
        return not bool(self.todo[c0 : c0 + first].any())

    def fill_rest(self, eos: int) -> None:
        """Fill every slot still masked with EOS, never generated (step_map -1), as an EOS stop does."""
        todo = self.todo.clone()
        self.x[todo] = eos
        self.todo[todo] = False

    def settled(self, eos: int) -> tuple[list[int], bool]:
        """``(ids, ended)``: the answer's tokens committed so far without a gap (from the first completion slot up
        to the first still-masked one, cut before the first EOS), and whether the answer is complete (an EOS
        reached that way). Later steps never change them: what a stream may send."""
        c0, c1 = int(self.canvas.comp_start[0]), int(self.canvas.comp_end[0])
        todo = self.todo[c0:c1]
        stop = int(todo.int().argmax()) if bool(todo.any()) else c1 - c0
        ids = self.x[c0 : c0 + stop].tolist()
        if eos in ids:
            return ids[: ids.index(eos)], True
        return ids, False

    def completion(self) -> list[int]:
        """The completion slots as they stand: committed tokens and the mask id where still masked (a viewer's
        canvas)."""
        c0, c1 = int(self.canvas.comp_start[0]), int(self.canvas.comp_end[0])
        return self.x[c0:c1].tolist()

    def trace(self) -> dict[str, torch.Tensor]:
        """The trace :func:`~dllm_rl.sampling.decode.to_rollout` reads, as a batch of one."""
        return {"step_map": self.step_map[None], "confidence": self.conf_map[None], "entropy": self.entropy_map[None],
                "nfe": torch.tensor([self.nfe], device=self.x.device)}
