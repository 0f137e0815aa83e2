"""TraceRL's value model (arXiv 2509.06949) over the steps of a uniform-state trajectory (DiffusionGemma).

The paper reads one value per token at the state in which the sampler committed it, and runs GAE over the decoding
steps with every token of a step sharing the step (:mod:`dllm_rl.rl.returns`). A uniform-state sampler commits
nothing for good: each step draws an id at every position of its canvas and *accepts* some of them (the rest are
re-noised), and the trajectory estimator (:mod:`dllm_rl.estimators.trajectory`) scores every accepted draw of every
counted step, at its own (step, position) column. So here a "token" is an accepted draw, the same columns:

* its state is the step's canvas ``x_s`` read by the decoder against the encoder cache of the prompt and the kept
  canvases before it, exactly as the policy's step ``s`` reads it; its value is the scalar head on the decoder's
  last hidden state at the draw's position (``[B, S * G]``, column ``s * G + g``, 0 off the accepted draws);
* its step is the row's counted step (the forward pass it was drawn in, ``UniformTrace.counted_index``), so the
  draws accepted in one step share it, and GAE runs over the counted steps in order (an outcome reward on the last).

**The self-conditioning input is left out of the value's input.** It is the previous step's tempered logits,
``[rows, canvas, vocab]`` (a 262k vocabulary), which the value backbone could only rebuild by projecting each step
onto the vocabulary (the head is scalar; nothing else here needs the LM head), or by storing the policy's. It is a
function of the earlier canvases, not of the draws of step ``s``, so a value without it is still a baseline of the
step (the advantage stays unbiased); it also makes each step's value independent of the others, so the steps can be
read in any grouping: the value update back-propagates ``value_model.step_chunk_size`` steps at a time (each chunk
re-encodes its prompt and canvases), which bounds its memory by one chunk's activations, whatever the trajectory's
length. The backbone's decoder stack is called for its hidden states; the LM head is never applied.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from dllm_rl.estimators import ScoringBatch
from dllm_rl.estimators.trajectory import group_context, live_steps, schedule_groups
from dllm_rl.models import DiffusionLM
from dllm_rl.rl.returns import step_ranks
from dllm_rl.sampling.uniform import CanvasContext


def _trace(batch: ScoringBatch):
    if batch.uniform is None:
        raise ValueError("the value model of a uniform-state family reads ScoringBatch.uniform (the rollout's "
                         "trajectory, Rollout.uniform); this batch has none")
    return batch.uniform


def valued_columns(batch: ScoringBatch) -> torch.Tensor:
    """``[B, S * G]`` bool: the accepted draws of the counted steps, the trajectory estimator's scored columns."""
    trace = _trace(batch)
    return (trace.accepted & trace.counted[..., None]).flatten(1)


def uniform_step_ranks(batch: ScoringBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rank [B, S * G], num_steps [B])``: each valued column's step among its row's counted steps that accepted a
    draw (every counted step accepts at least one), -1 elsewhere."""
    trace = _trace(batch)
    key = trace.counted_index()[..., None].expand(trace.accepted.shape).flatten(1)
    return step_ranks(key, valued_columns(batch))


def _chunks(steps: list[int], size: int | None) -> list[list[int]]:
    size = size or max(len(steps), 1)
    return [steps[i:i + size] for i in range(0, len(steps), size)]


def unwrapped(module: nn.Module) -> nn.Module:
    """The value model itself, not its DDP wrapper: this reading calls it with an encoder context, outside the
    wrapper's forward, as the policy's scorers call the policy, so DDP arms no reduction (which would wait for the
    parameters no text run reaches, the vision tower, and fail at the next update) and the backend averages the
    gradients itself (:func:`dllm_rl.training.backend.micro_step`)."""
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def uniform_value_chunks(module: nn.Module, backbone: DiffusionLM, batch: ScoringBatch, chunk: int | None = None
                         ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(values, columns)`` per chunk of ``chunk`` counted steps (None: all) of each schedule group of ``batch``:
    ``values`` ``[B, S * G]`` float32, the value of each accepted draw of the chunk's steps (0 elsewhere; under grad,
    the graph of that chunk only), ``columns`` the bool mask of those draws. ``module`` is the
    :class:`~dllm_rl.rl.value.ValueModel` (or its distributed wrapper), ``backbone`` its plain backbone."""
    trace = _trace(batch)
    hf, span = backbone.hf_model, trace.canvas_length
    n_steps, g_len = trace.step.shape[1], batch.completion_len
    for rows in schedule_groups(trace):
        tr = trace.select(torch.tensor(rows, device=trace.step.device))
        for part in _chunks(live_steps(tr), chunk):
            yield _read_steps(module, hf, batch, rows, part, span, n_steps, g_len)


def _read_steps(module: nn.Module, hf: nn.Module, batch: ScoringBatch, rows: list[int], steps: list[int], span: int,
                n_steps: int, g_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The values of ``steps`` of the group ``rows``: its encoder context rebuilt (the prompt, then each kept canvas
    before a step's canvas), one decoder forward per step."""
    ctx, tr, idx = group_context(hf, batch, rows)
    completion = batch.completion_ids[idx.to(batch.completion_ids.device)]
    encoded, flat, picked = 0, [], []
    for s in steps:
        k = int(tr.canvas_index[0, s])
        while encoded < k:  # the canvases kept before this step's join the encoder cache
            ctx.append(completion[:, encoded * span:(encoded + 1) * span].to(hf.device))
            encoded += 1
        cols = slice(k * span, (k + 1) * span)
        values = unwrapped(module)(tr.canvas[:, s, cols].long(), context=ctx)  # [R, C]: a scalar per position
        r, p = torch.nonzero(tr.accepted[:, s, cols] & tr.counted[:, s, None], as_tuple=True)
        flat.append((idx[r] * n_steps + s) * g_len + k * span + p)
        picked.append(values[r, p])
    bsz = batch.batch_size
    index = torch.cat(flat)
    out = torch.zeros(bsz * n_steps * g_len, dtype=torch.float32, device=hf.device).index_put((index,),
                                                                                             torch.cat(picked))
    columns = torch.zeros(bsz * n_steps * g_len, dtype=torch.bool, device=hf.device).index_fill_(0, index, True)
    return out.view(bsz, -1), columns.view(bsz, -1)


def idle_uniform_value(module: nn.Module, backbone: DiffusionLM) -> torch.Tensor:
    """The value model on a one-token prompt and a one-token canvas (pad ids): the forward a rank with nothing to
    value makes, so that every rank runs as many."""
    ids = torch.full((1, 1), backbone.pad_token_id, dtype=torch.long, device=backbone.device)
    ctx = CanvasContext(backbone.hf_model, ids, torch.ones_like(ids, dtype=torch.bool))
    return unwrapped(module)(ids, context=ctx)
