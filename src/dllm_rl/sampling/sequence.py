"""One request's decoding state in the continuous-batching engine, and the slot rows that hold the running
requests' tokens.

A :class:`Sequence` starts from :func:`~dllm_rl.sampling.canvas.build_canvas` of its one prompt: exactly the layout
:func:`~dllm_rl.sampling.generate` uses for that prompt alone (no padding: column = position), decoded block by
block with the same rules (:mod:`dllm_rl.sampling.decode`), with its own random stream and counters, so what it
decodes depends on nothing but itself. Once it has a slot, its tokens, masks and trace live in that slot's row of
the engine's :class:`SlotRows` (one tensor per field for every slot), so that a step chooses, commits and checks all
its rows in a few batched ops and one host synchronisation, however many slots run: per-sequence tensor work costs
a kernel launch and a device round trip per row, which at real sizes rivals the forward itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dllm_rl.models.eos import as_ids, first_eos
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import Canvas, apply_prefill, build_canvas
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.logprobs import LogprobMaps, TokenLogprobs


class SlotRows:
    """Tokens, masks and trace of ``slots`` sequences, one row each (``[slots, width]``), the masks each current
    block held when it began (``drawn``: the slots RCR may re-mask) and their count (``masked0``, the static
    schedule's input). ``width`` grows to the widest canvas admitted; memory is bounded by the slots, never the
    queue."""

    FIELDS = {"x": torch.long, "todo": torch.bool, "step_map": torch.long, "conf": torch.float32,
              "entropy": torch.float32, "drawn": torch.bool}

    def __init__(self, slots: int, device):
        for name, dtype in self.FIELDS.items():
            setattr(self, name, torch.zeros((slots, 0), dtype=dtype, device=device))
        self.masked0 = torch.zeros(slots, dtype=torch.long, device=device)
        self.prev_raw: torch.Tensor | None = None  # [slots, V]: a shifted family's logits before the block (cached)

    @property
    def width(self) -> int:
        return self.x.shape[1]

    def reserve(self, width: int) -> None:
        if width <= self.width:
            return
        for name in self.FIELDS:
            old = getattr(self, name)
            grown = old.new_zeros((old.shape[0], width))
            grown[:, : old.shape[1]] = old
            setattr(self, name, grown)

    def raw_logits(self, like: torch.Tensor) -> torch.Tensor:
        """``prev_raw``, allocated (zeros) for the vocabulary and dtype of ``like`` (``[n, V]``) on first use."""
        if self.prev_raw is None or self.prev_raw.shape[-1] != like.shape[-1]:
            self.prev_raw = like.new_zeros((len(self.masked0), like.shape[-1]))
        return self.prev_raw

    def load(self, slot: int, canvas: Canvas) -> None:
        """Put a one-row canvas in ``slot``: its tokens and masks, an empty trace."""
        width = canvas.x.shape[1]
        self.reserve(width)
        self.x[slot, :width] = canvas.x[0]
        self.todo[slot] = False
        self.todo[slot, :width] = canvas.todo[0]
        self.step_map[slot] = -1
        self.conf[slot] = 0.0
        self.entropy[slot] = 0.0

    def move(self, src: int, dst: int) -> None:
        for t in (*(getattr(self, name) for name in self.FIELDS), self.masked0, self.prev_raw):
            if t is not None:
                t[dst] = t[src]


@dataclass
class Sequence:
    """A request being decoded (see the module docstring)."""

    request_id: int
    canvas: Canvas  # one row: the layout (its x / todo are the starting state, copied into the slot's row)
    generator: torch.Generator
    block_idx: int = 0  # the decoded block being worked on
    local_step: int = 0  # steps spent on it (static schedule counts)
    nfe: int = 0
    cached: int = 0  # columns [0, cached) are in the slot's KV cache (block models; full attention with a cache)
    comp: tuple[int, int] = (0, 0)  # its completion columns [c0, c1)
    slot: int = -1
    rows: SlotRows | None = None  # where its state lives once it has a slot
    config: DecodeConfig | None = None  # its decoding rules (the engine's, or the request's own)
    adapter: str | None = None  # the LoRA adapter its forwards use (None: the model as it is called)
    until: int | None = None  # until_block: it ends before this decoded block (a partial decode)
    record: str | None = None  # record_steps: "sampled" | "greedy" (each step's prediction, step_record)
    records: list = dataclasses.field(default_factory=list)  # per step: (tokens, masked, confidence) [G] each
    images: PromptImages | None = None  # LLaDA-V: its prompt's images (one row; the prompt starts at column 0)
    embeds: tuple = ()  # the same, ready for its forwards (row_splice.request_images)
    prefill: dict[int, int] | None = None  # completion offset -> token committed before decoding
    empty: dict[int, bool] | None = None  # prefill only: blocks left with nothing to decode -> holds only EOS / pad
    joining: bool = False  # it took its slot in this step (its first forward may run apart)
    logprobs: LogprobMaps | None = None  # asked for: each committed token's log-probability at its commit step

    @classmethod
    def new(cls, request_id: int, prompt: list[int], gen_length: int, block: int, block_causal: bool, mask_id: int,
            pad_id: int, device, seed: int, images: PromptImages | None = None, prefill: dict[int, int] | None = None,
            eos: int | tuple[int, ...] = ()) -> Sequence:
        # no splice on the canvas: the engine splices a step's rows from their images at the step's own columns
        canvas = build_canvas([prompt], gen_length, block, block_causal, mask_id, pad_id, device)
        seq = cls(request_id, canvas, torch.Generator(device=device).manual_seed(int(seed)))
        seq.images = images
        seq.comp = (int(canvas.comp_start[0]), int(canvas.comp_end[0]))
        if prefill is not None:
            apply_prefill(canvas, [prefill])
            seq.prefill = dict(prefill)
            x, todo, (c0, c1) = canvas.x[0].tolist(), canvas.todo[0].tolist(), seq.comp
            seq.empty, ends = {}, {*as_ids(eos), pad_id}  # a block of only EOS (any id) / pad ends an EOS stop
            for j in range(canvas.num_blocks):
                s, e = canvas.cols(j)
                if not any(todo[s:e]):
                    seq.empty[j] = all(x[c] in ends or not c0 <= c < c1 for c in range(s, e))
        return seq

    def place(self, rows: SlotRows, slot: int) -> None:
        """Take ``slot`` of ``rows``: the canvas's starting state goes there."""
        self.rows, self.slot = rows, slot
        rows.load(slot, self.canvas)

    @property
    def x(self) -> torch.Tensor:
        return self.canvas.x[0] if self.rows is None else self.rows.x[self.slot, : self.width]

    @property
    def todo(self) -> torch.Tensor:
        return self.canvas.todo[0] if self.rows is None else self.rows.todo[self.slot, : self.width]

    @property
    def width(self) -> int:
        return int(self.canvas.x.shape[1])

    def cols(self) -> tuple[int, int]:
        return self.canvas.cols(self.block_idx)

    def final_slots(self) -> int:
        """The completion slots (from the first) whose committed tokens no later step changes: all of them, except
        under RCR remasking, which may take back any token of the block being decoded: those before that block."""
        if self.config.remasking == "rcr":
            return max(self.cols()[0] - self.comp[0], 0)
        return self.comp[1] - self.comp[0]

    def fill_rest(self, eos: int) -> None:
        """Fill every slot still masked with EOS, never generated (step_map -1): the early stop."""
        self.x.masked_fill_(self.todo, eos)  # (a boolean index would read the device)
        self.todo.fill_(False)

    def stop_after(self, end: int, eos: int) -> None:
        """An EOS stop after the block ending at column ``end``: every completion slot from there holds EOS, never
        generated, as :func:`~dllm_rl.sampling.decode.decode` fills them."""
        self.x[end : self.comp[1]] = eos
        self.todo[end : self.comp[1]] = False

    def token_logprobs(self) -> TokenLogprobs | None:
        """Its completion's tokens with their log-probabilities at commit as they stand (None: not asked for)."""
        if self.logprobs is None:
            return None
        if self.rows is None:
            steps = torch.full((self.width,), -1, dtype=torch.long, device=self.canvas.x.device)
        else:
            steps = self.rows.step_map[self.slot, : self.width]
        return self.logprobs.read(self.x, steps, *self.comp)

    def result(self) -> tuple[Canvas, dict[str, torch.Tensor]]:
        """Its canvas as it stands and the trace :func:`~dllm_rl.sampling.decode.to_rollout` reads, as a batch of
        one (copies: the slot goes to another sequence next). A sequence that never took a slot (its prefill left
        nothing to decode) reads its own canvas."""
        device = self.canvas.x.device
        if self.rows is None:
            w = self.width
            canvas = self.canvas
            trace = {"step_map": torch.full((1, w), -1, dtype=torch.long, device=device),
                     "confidence": torch.zeros((1, w), device=device),
                     "entropy": torch.zeros((1, w), device=device)}
        else:
            row, w = self.slot, self.width
            canvas = dataclasses.replace(self.canvas, x=self.rows.x[row : row + 1, :w].clone(),
                                         todo=self.rows.todo[row : row + 1, :w].clone())
            trace = {"step_map": self.rows.step_map[row : row + 1, :w].clone(),
                     "confidence": self.rows.conf[row : row + 1, :w].clone(),
                     "entropy": self.rows.entropy[row : row + 1, :w].clone()}
        trace["nfe"] = torch.tensor([self.nfe], device=device)
        if self.record:  # [1, steps, G], as generate's StepRecorder lays a batch of one out
            g = self.comp[1] - self.comp[0]
            for name, k, dtype in (("step_tokens", 0, torch.int32), ("step_masked", 1, torch.bool),
                                   ("step_confidence", 2, torch.float32)):
                got = [r[k] for r in self.records]
                trace[name] = (torch.stack(got) if got else torch.zeros((0, g), dtype=dtype, device=device))[None]
        return canvas, trace


def settled(tokens: list[int], todo: list[bool], eos: int | tuple[int, ...], final: int | None = None
            ) -> tuple[list[int], bool]:
    """``(ids, ended)`` of a completion as it stands (its slots' tokens and still-masked flags, host lists): the
    tokens committed without a gap from the first slot up to the first still-masked one (and within the first
    ``final`` slots, :meth:`Sequence.final_slots`), cut before the first EOS (``eos``: an id, or every id that ends
    a row), and whether the answer is complete (an EOS reached that way). Later steps never change them: what a
    stream may send."""
    if final is not None:
        tokens, todo = tokens[:final], todo[:final] + [True]
    stop = todo.index(True) if True in todo else len(tokens)
    ids = tokens[:stop]
    cut = first_eos(ids, eos)
    if cut is not None:
        return ids[:cut], True
    return ids, False
