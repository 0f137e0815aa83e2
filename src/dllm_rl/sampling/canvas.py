"""The canvas: a batch of prompts laid out with their completion slots, and how the slots split into blocks.

Layout (one row per prompt, ``T`` columns)::

    [left pad | prompt head | prompt tail | completion slots (masks) | right pad]
                            ^ start (same column in every row)

* Full-attention models (LLaDA, Dream): the tail is empty, ``start`` = the longest prompt, the completion is
  exactly ``gen_length`` slots split into ``gen_length / block_length`` semi-autoregressive blocks.
* Block models (SDAR/TraDo): blocks are absolute (``position // block_size``, the foundation's one rule), so
  a prompt of length p keeps its tail ``p % block_size`` tokens in the first decoded block. Rows are
  left-padded so that this block starts at the same column ``start`` in every row; a row decodes
  ``ceil((tail + gen_length) / block_size)`` blocks (SDAR rounds the sequence up to a block boundary), i.e.
  ``gen_length`` completion tokens plus ``block_size - tail`` when the tail is non-empty. Rows needing fewer
  blocks than the batch's widest simply finish earlier (their extra columns are right padding).

Positions count real tokens only (``cumsum(valid) - 1``), so padding never moves a token's position or
block: a prompt decodes the same alone or in any batch.

Images (LLaDA-V): a prompt's image positions are prompt tokens whose input embeddings are the image's features;
``splice`` (:class:`~dllm_rl.models.diffusion_lm.EmbedSplice` over the canvas) puts them at the prompt's
columns, wherever the left padding put the prompt. They are never masked, decoded or scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_rl.models import position_ids_from_valid
from dllm_rl.models.diffusion_lm import EmbedSplice
from dllm_rl.models.prompt_images import PromptImages


@dataclass
class Canvas:
    """Token ids and bookkeeping of one decoding batch (see the module docstring)."""

    x: torch.Tensor  # [B, T] long: prompt, committed tokens, mask id on undecoded slots, pad elsewhere
    valid: torch.Tensor  # [B, T] bool: prompt and completion slots (attention keys)
    pos: torch.Tensor  # [B, T] long: position ids
    todo: torch.Tensor  # [B, T] bool: completion slots not committed yet
    start: int  # first column of the first decoded block
    block: int  # decoding block length
    num_blocks: int  # blocks of the widest row
    prompt_len: torch.Tensor  # [B]
    comp_start: torch.Tensor  # [B] first completion column
    comp_end: torch.Tensor  # [B] one past the last completion column
    splice: EmbedSplice | None = None  # [B, T] image features at their prompt columns (LLaDA-V); None: text only

    def cols(self, j: int) -> tuple[int, int]:
        """Columns ``[s, e)`` of decoded block ``j``."""
        s = self.start + j * self.block
        return s, s + self.block

    @property
    def completion_width(self) -> int:
        return int((self.comp_end - self.comp_start).max().item())

    def gather_completion(self, t: torch.Tensor, fill) -> torch.Tensor:
        """``[B, W]`` left-aligned completion columns of ``t`` (``[B, T]``); ``fill`` past each row's end."""
        width = self.completion_width
        idx = self.comp_start[:, None] + torch.arange(width, device=t.device)[None, :]
        inside = idx < self.comp_end[:, None]
        vals = t.gather(1, idx.clamp(max=t.shape[1] - 1))
        return torch.where(inside, vals, torch.full_like(vals, fill))

    def completion_slots(self) -> torch.Tensor:
        """``[B, W]`` bool: which left-aligned completion columns exist for each row."""
        idx = torch.arange(self.completion_width, device=self.x.device)[None, :]
        return idx < (self.comp_end - self.comp_start)[:, None]


def span(prompt_len: int, gen_length: int, block: int, block_causal: bool) -> tuple[int, int]:
    """``(tail, num_blocks)`` of one prompt: tokens of its last partial block that share the first decoded
    block (block models only) and the number of blocks it decodes."""
    tail = prompt_len % block if block_causal else 0
    return tail, -(-(tail + gen_length) // block)


def canvas_width(prompt_len: int, gen_length: int, block: int, block_causal: bool) -> int:
    """The columns (= positions) of one prompt's canvas: the prompt and its completion slots."""
    tail, num_blocks = span(prompt_len, gen_length, block, block_causal)
    return prompt_len - tail + num_blocks * block


def build_canvas(
    prompts: list[list[int]],
    gen_length: int,
    block: int,
    block_causal: bool,
    mask_id: int,
    pad_id: int,
    device: torch.device | str = "cpu",
    images: PromptImages | None = None,
) -> Canvas:
    """Lay out ``prompts`` with their masked completion slots (see the module docstring); ``images`` (one row per
    prompt) are spliced at their prompts' columns."""
    spans = [span(len(p), gen_length, block, block_causal) for p in prompts]
    heads = [len(p) - tail for p, (tail, _) in zip(prompts, spans)]
    start = max(heads)
    num_blocks = max(nb for _, nb in spans)
    bsz, width = len(prompts), start + num_blocks * block
    x = torch.full((bsz, width), pad_id, dtype=torch.long)
    valid = torch.zeros((bsz, width), dtype=torch.bool)
    todo = torch.zeros_like(valid)
    comp_start, comp_end = [], []
    for i, (p, head, (tail, nb)) in enumerate(zip(prompts, heads, spans)):
        left = start - head
        c0, c1 = start + tail, start + nb * block
        x[i, left:c0] = torch.tensor(p, dtype=torch.long)
        x[i, c0:c1] = mask_id
        valid[i, left:c1] = True
        todo[i, c0:c1] = True
        comp_start.append(c0)
        comp_end.append(c1)
    as_long = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
    valid = valid.to(device)
    splice = None
    if images is not None:
        splice = images.splice(as_long([start - head for head in heads]), width)
    return Canvas(
        x=x.to(device), valid=valid, pos=position_ids_from_valid(valid), todo=todo.to(device), start=start,
        block=block, num_blocks=num_blocks, prompt_len=as_long([len(p) for p in prompts]),
        comp_start=as_long(comp_start), comp_end=as_long(comp_end), splice=splice,
    )


def apply_prefill(canvas: Canvas, prefill: list[dict[int, int]]) -> None:
    """Commit given completion tokens before decoding (inpainting, e.g. IGPO's hints): ``prefill[i]`` maps a
    completion offset of row ``i`` to a token id. Those slots are no longer to do, so the sampler decodes
    only the others and sees the given tokens as context; offsets past a row's completion are an error."""
    if len(prefill) != canvas.x.shape[0]:
        raise ValueError(f"prefill has {len(prefill)} entries for {canvas.x.shape[0]} prompts")
    for i, slots in enumerate(prefill):
        width = int(canvas.comp_end[i] - canvas.comp_start[i])
        for offset, token in slots.items():
            if not 0 <= int(offset) < width:
                raise ValueError(f"prefill[{i}]: offset {offset} is outside the {width} completion slots")
            col = int(canvas.comp_start[i]) + int(offset)
            canvas.x[i, col] = int(token)
            canvas.todo[i, col] = False
