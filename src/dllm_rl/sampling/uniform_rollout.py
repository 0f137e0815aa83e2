"""Uniform-state rollouts (DiffusionGemma) as a :class:`~dllm_rl.sampling.Rollout`: the front door's decoding of a
uniform family (:func:`generate_uniform`, called by :func:`dllm_rl.sampling.generate`) and the trajectory the
sampler took (:class:`UniformTrace`, ``Rollout.uniform``).

**Completion.** ``completion_ids`` ``[B, G]`` (``G = gen_length``, whole canvases) hold the kept canvases, each the
argmax of its last step's tempered logits (with ``final_tokens="sampled"``, that step's draws); with ``stop_on_eos``
a row is finished by the canvas holding its first EOS, and its later tokens are pad. ``completion_mask``: up to and
including the first EOS. ``nfe``: the decoder passes each row was counted for (the stock ``decoder_forward_passes``:
not after it stopped, not after it finished).

**step_map** ``[B, G]``: a uniform step does not commit a token for good (an accepted draw may be re-noised later,
and the kept token is the argmax, which need not be a draw at all). So ``step_map[b, j]`` is the row's counted step
(its 0-based forward pass, as for masked rollouts: ``step_map < nfe``) at which position ``j`` last *accepted a draw
equal to the kept token*; ``-1`` where no counted step did (the argmax settled on a token never kept as drawn), and
at the pad after a row's EOS.

**Trajectory** (:class:`UniformTrace`): per recorded step ``s`` (``S`` = every step of every canvas of the batch;
rows of a batch share them, rows of batches concatenated later are right-padded), the canvas fed in, the ids
drawn and the positions accepted, each in its canvas's columns of the ``[B, S, G]`` tensors (pad / False in the
other columns), with per step the canvas index, the schedule step, whether self-conditioning was on and whether
the row was counted. :meth:`UniformTrace.record` rebuilds the sampler's own record of one batch, which
:mod:`dllm_rl.sampling.uniform_trace` replays and scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dllm_rl.sampling.uniform import UniformDecodeConfig, UniformStep, temperature


@dataclass
class UniformTrace:
    """The steps a uniform-state sampler took (see the module notes). ``[B, S]``: ``canvas_index`` (-1: no step
    there, past the end of a shorter batch), ``step`` (the schedule's step, counting down to 1; 0 where none),
    ``self_conditioned``, ``counted`` (the row was neither stopped nor finished: the step is one of its NFE).
    ``[B, S, G]``: ``canvas`` (int32, ids fed in), ``sampled`` (int32, ids drawn), ``accepted`` (bool, the draws
    kept into the next canvas; every other position of the canvas was re-noised). ``temperature`` ``[B, S]`` float32:
    the schedule's temperature of each step, the very value the sampler divided its logits by (1 where no step;
    None in a trace built without the sampler's config)."""

    canvas_length: int
    canvas_index: torch.Tensor
    step: torch.Tensor
    self_conditioned: torch.Tensor
    stopped: torch.Tensor
    done: torch.Tensor
    canvas: torch.Tensor
    sampled: torch.Tensor
    accepted: torch.Tensor
    temperature: torch.Tensor | None = None

    _FILL = {"canvas_index": -1, "step": 0, "self_conditioned": False, "stopped": False, "done": False,
             "canvas": None,
             "sampled": None, "accepted": False, "temperature": 1.0}  # None: the pad id

    @classmethod
    def from_steps(cls, steps: list[UniformStep], canvas_length: int, width: int, pad: int,
                   cfg: UniformDecodeConfig | None = None) -> UniformTrace:
        """The trace of one batch's record (``width`` completion columns); ``cfg``: the sampler's, whose schedule
        gives each step's temperature."""
        bsz, device = steps[0].canvas.shape[0], steps[0].canvas.device
        n = len(steps)
        out = {"canvas": torch.full((bsz, n, width), pad, dtype=torch.int32, device=device),
               "sampled": torch.full((bsz, n, width), pad, dtype=torch.int32, device=device),
               "accepted": torch.zeros((bsz, n, width), dtype=torch.bool, device=device)}
        for s, st in enumerate(steps):
            cols = slice(st.canvas_index * canvas_length, (st.canvas_index + 1) * canvas_length)
            out["canvas"][:, s, cols] = st.canvas.to(torch.int32)
            out["sampled"][:, s, cols] = st.sampled.to(torch.int32)
            out["accepted"][:, s, cols] = st.accepted
        per_step = torch.tensor([[st.canvas_index, st.step, st.self_conditioned] for st in steps], device=device)
        if cfg is not None:
            out["temperature"] = torch.stack([temperature(cfg, st.step) for st in steps]).to(device).expand(
                bsz, n).clone()
        return cls(canvas_length, per_step[:, 0].expand(bsz, n).clone(), per_step[:, 1].expand(bsz, n).clone(),
                   per_step[:, 2].bool().expand(bsz, n).clone(), torch.stack([st.stopped for st in steps], dim=1),
                   torch.stack([st.done for st in steps], dim=1), **out)

    @property
    def counted(self) -> torch.Tensor:
        """``[B, S]`` bool: the steps each row was counted for (a real step, neither stopped nor finished)."""
        return (self.canvas_index >= 0) & ~(self.stopped | self.done)

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self._FILL if getattr(self, name) is not None}

    def to(self, device) -> UniformTrace:
        return replace(self, **{k: v.to(device) for k, v in self._tensors().items()})

    def select(self, index: torch.Tensor) -> UniformTrace:
        return replace(self, **{k: v[index] for k, v in self._tensors().items()})

    @staticmethod
    def cat(traces: list[UniformTrace], width: int, pad: int) -> UniformTrace:
        """Rows of several traces, right-padded to the most steps and ``width`` columns."""
        lengths = {t.canvas_length for t in traces}
        if len(lengths) > 1:
            raise ValueError(f"UniformTrace.cat: traces of different canvases ({sorted(lengths)})")
        steps = max(t.step.shape[1] for t in traces)
        out = {}
        for name, fill in UniformTrace._FILL.items():
            parts = []
            for t in traces:
                v = getattr(t, name)
                if v is None:  # a trace without temperatures: 1, the fill
                    v = torch.full(t.step.shape, fill, dtype=torch.float32, device=t.step.device)
                shape = (v.shape[0], steps, width)[:v.dim()]
                padded = torch.full(shape, pad if fill is None else fill, dtype=v.dtype, device=v.device)
                padded[(slice(None), slice(0, v.shape[1]), slice(0, v.shape[-1]))[:v.dim()]] = v
                parts.append(padded)
            out[name] = torch.cat(parts)
        return UniformTrace(traces[0].canvas_length, **out)

    def counted_index(self) -> torch.Tensor:
        """``[B, S]`` long: each step's index among the row's counted steps (its forward pass), -1 where uncounted."""
        return torch.where(self.counted, self.counted.long().cumsum(dim=1) - 1, -1)

    def record(self) -> list[UniformStep]:
        """The sampler's record of one batch, as
        :func:`~dllm_rl.sampling.uniform_trace.replay_logits` and ``trajectory_logprob`` read it. Rows must share
        their steps (one batch of the front door)."""
        if not bool((self.canvas_index == self.canvas_index[:1]).all()):
            raise ValueError("UniformTrace.record: rows from different batches do not share their steps")
        out, width = [], self.canvas_length
        for s in range(self.step.shape[1]):
            c = int(self.canvas_index[0, s])
            if c < 0:
                break
            cols = slice(c * width, (c + 1) * width)
            out.append(UniformStep(c, int(self.step[0, s]), self.canvas[:, s, cols].long(),
                                   bool(self.self_conditioned[0, s]), self.sampled[:, s, cols].long(),
                                   self.accepted[:, s, cols], self.stopped[:, s], self.done[:, s]))
        return out


def uniform_step_map(trace: UniformTrace, kept: torch.Tensor) -> torch.Tensor:
    """``[B, G]`` long: the counted step at which each position last accepted a draw equal to its kept token
    (``kept`` ``[B, G]``), -1 where none did (module notes)."""
    index = trace.counted_index()
    hit = trace.accepted & (trace.sampled.long() == kept[:, None, :]) & trace.counted[..., None]
    return torch.where(hit, index[..., None], -1).amax(dim=1)


def uniform_steps(trace: UniformTrace, row: int, piece) -> list[dict]:
    """Row ``row`` of ``trace`` as JSON-ready steps (``dllm-rl generate --trace``, the trace viewer): its counted
    steps, each with its counted index (``step``, as ``step_map`` numbers them), canvas, self-conditioning, the ids
    drawn in that canvas (``tokens``: ``piece(id)`` of each) and the accepted positions within the canvas."""
    width, index = trace.canvas_length, trace.counted_index()[row]
    out = []
    for s in trace.counted[row].nonzero().flatten().tolist():
        c = int(trace.canvas_index[row, s])
        ids = trace.sampled[row, s, c * width:(c + 1) * width].tolist()
        out.append({"step": int(index[s]), "canvas": c, "self_conditioned": bool(trace.self_conditioned[row, s]),
                    "ids": ids, "tokens": [piece(t) for t in ids],
                    "accepted": trace.accepted[row, s, c * width:(c + 1) * width].nonzero().flatten().tolist()})
    return out


__all__ = ["UniformTrace", "uniform_step_map", "uniform_steps"]
