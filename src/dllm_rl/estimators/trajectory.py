"""``trajectory``: the log-probability of the steps a uniform-state sampler took (DiffusionGemma), TraceRL's
principle (arXiv 2509.06949: train on the trajectory the model took at inference) for uniform-state diffusion.

A rollout (:class:`~dllm_rl.sampling.uniform_rollout.UniformTrace`, ``ScoringBatch.uniform``) records per step ``s``
the canvas fed in ``x_s``, whether self-conditioning was on, the ids drawn ``y_s``, the accepted positions ``A_s``,
the schedule's temperature ``T_s`` and which rows were counted (neither stopped nor finished). The policy's
log-probability of the trajectory is

    log pi_theta(tau) = sum_{s counted} sum_{i in A_s} log softmax(z_theta(x_s, c_s) / T_s)[i, y_{s,i}]

with ``z_theta`` the decoder's (soft-capped) logits over the encoder cache of the prompt and the kept canvases
before ``s``'s canvas, and ``c_s`` the self-conditioning input: none on a canvas's first step, else the previous
step's tempered logits. Re-noised positions drew ids that were thrown away; the acceptance rule, the re-noising, the
stopping and the kept argmax canvas depend on the logits and on policy-free random ids only, so they add no term
(:mod:`dllm_rl.sampling.uniform_trace`). The first step of a canvas starts from uniform random ids, whose
probability does not depend on the policy.

**Self-conditioning under the current policy: the chain is replayed.** ``c_s`` is the *current* policy's tempered
logits of step ``s - 1`` (given ``x_{s-1}`` and ``c_{s-1}``), detached: the gradient of step ``s`` flows through
``z_theta(x_s, .)`` only, not through its input. So at the first update, where the policy is the sampler's, every
``c_s`` is what the sampler fed and the replayed log-probs are the sampler's (to float rounding, the scored
positions being projected a chunk at a time; the old and current scores of an update are computed alike, so the
first ratio is exactly 1); later the input follows the policy, as it does when the policy samples. (The
recorded inputs of the behaviour policy would have to be stored, ``[B, canvas, vocab]`` per step, or recomputed
with the old weights.) A row stopped by adaptive stopping carries its input unchanged, as the sampler does.

**Per-token layout.** Every step is scored at its own canvas, so a completion position may be scored at many
steps. ``TokenScores`` holds one draw whose columns are the (step, position) pairs: ``logp`` / ``weight`` are
``[1, B, S * G]``, column ``s * G + g`` the draw accepted at completion column ``g`` in step ``s`` (``S`` the trace's
steps). ``sequence_score()`` is ``log pi_theta(tau)``; a token-level loss (TraceRL's, CJ-GRPO's) sees one ratio per
accepted draw; ``info["transition"]`` numbers each column's counted step (CJ-GRPO's transitions). Every accepted
draw of a counted step is scored, those after the answer's EOS in its last canvas too (they are the sampler's
actions; ``ScoringBatch.loss_mask`` can drop completion columns).

**Shrinkage.** TraceRL's ``s`` scores ``s`` merged steps from the state before the first; here a step's draws come
from its own canvas and self-conditioning input, which the earlier state does not hold, so only ``s = 1`` exists.

**Memory.** The self-conditioning inputs are ``[rows, canvas, vocab]`` (a 262k vocabulary): each is computed without
gradient from the step's hidden states and only the current one is held. The scored log-probs project
``logprob_chunk_size`` positions onto the vocabulary at a time (:func:`~dllm_rl.models.logprobs.selected_logprobs`).
Under gradient the graph holds every replayed step's activations of the micro-batch (``model.gradient_checkpointing``
keeps only the layers' inputs), unless the update goes through :func:`backward_by_steps` (``train.step_chunk_size``):
given the loss's gradient in the log-probs (from scores without a graph), each chunk of steps is replayed over an
encoder pass of its own and back-propagated before the next, the self-conditioning input carried across (it has no
gradient), so the memory is one chunk's and the gradient the all-at-once one.

Rows of a batch that were sampled together share their steps; rows from different rollout batches are replayed as
separate groups, each with its prompts trimmed to the group's widest (the width it was sampled at when the group
holds its batch's longest prompt; otherwise positions shift uniformly, which rotary attention ignores up to rounding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dllm_rl.estimators.batch import ScoringBatch, TokenScores
from dllm_rl.estimators.registry import register_uniform
from dllm_rl.models.logprobs import DEFAULT_CHUNK_SIZE, check_chunk_size, selected_logprobs
from dllm_rl.sampling.uniform import CanvasContext


def check_trajectory_options(*, shrinkage: int = 1, logprob_chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
    """The ``trajectory`` estimator's options (``ValueError``): shrinkage 1 only (module notes), a chunk >= 0."""
    if isinstance(shrinkage, bool) or not isinstance(shrinkage, int) or shrinkage != 1:
        raise ValueError(f"shrinkage must be 1 for the trajectory estimator, got {shrinkage!r}: each step of a "
                         "uniform-state trajectory is scored at its own canvas and self-conditioning input, which an "
                         "earlier state does not hold (TraceRL's merged steps have no uniform-state form)")
    check_chunk_size(logprob_chunk_size)


def schedule_groups(trace) -> list[list[int]]:
    """The rows of ``trace`` grouped by their steps (canvas and schedule step of each): the rows of one rollout batch,
    which the sampler stepped together."""
    groups: dict[tuple, list[int]] = {}
    for b in range(trace.step.shape[0]):
        key = (tuple(trace.canvas_index[b].tolist()), tuple(trace.step[b].tolist()))
        groups.setdefault(key, []).append(b)
    return list(groups.values())


class _Head:
    """The LM head with the stock soft-capping, divided by a step's temperature: the sampler's tempered logits."""

    def __init__(self, hf, temperature: torch.Tensor):
        self.hf, self.temperature = hf, temperature
        self.cap = hf.config.get_text_config().final_logit_softcapping

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.hf.lm_head(hidden).to(torch.float32)
        if self.cap:
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits / self.temperature


def group_context(hf, batch: ScoringBatch, rows: list[int]):
    """``(context, trace, index)`` of the rows ``rows`` of ``batch`` (one schedule, :func:`schedule_groups`): a
    :class:`~dllm_rl.sampling.uniform.CanvasContext` of ``hf`` over their prompts trimmed to the group's widest (module
    notes), their trajectory on ``hf``'s device, and their indices there."""
    device = hf.device
    idx = torch.tensor(rows, device=batch.prompt_ids.device)
    width = int(batch.prompt_mask[idx].sum(-1).max())
    prompt_len = batch.prompt_len
    ctx = CanvasContext(hf, batch.prompt_ids[idx, prompt_len - width:].to(device),
                        batch.prompt_mask[idx, prompt_len - width:].to(device))
    return ctx, batch.uniform.select(idx.to(batch.uniform.step.device)).to(device), idx.to(device)


def live_steps(tr) -> list[int]:
    """The steps of a group's trajectory ``tr`` that score something (some row counted), in order."""
    return [s for s in range(tr.step.shape[1]) if int(tr.canvas_index[0, s]) >= 0 and bool(tr.counted[:, s].any())]


def _replay_group(model, batch: ScoringBatch, rows: list[int], chunk_size: int, out: dict,
                  flush: StepFlush | None = None) -> None:
    """Replay the steps of ``rows`` (one schedule) and append their scored (flat index, log-prob) pairs to ``out``;
    with ``flush``, hand them to it instead every ``flush.steps`` scored steps (and at the end), each chunk's graph
    built over an encoder context of its own (:func:`backward_by_steps`)."""
    hf, trace = model.hf_model, batch.uniform
    device = hf.device
    ctx, tr, idx = group_context(hf, batch, rows)
    pending = 0
    temps = tr.temperature if tr.temperature is not None else torch.ones(tr.step.shape, device=device)
    counted, span = tr.counted, trace.canvas_length
    n_steps, g_len = tr.step.shape[1], batch.completion_len
    current, self_cond = 0, None
    for s in range(n_steps):
        k = int(tr.canvas_index[0, s])
        if k < 0:
            break
        if k != current:  # a new canvas: the one kept before it joins the encoder cache
            ctx.append(batch.completion_ids[idx.to(batch.completion_ids.device), (k - 1) * span: k * span].to(device))
            current, self_cond = k, None
        if not bool(counted[:, s].any()):  # every row stopped or finished: nothing to score until the next canvas
            continue
        if bool(tr.self_conditioned[0, s]) != (self_cond is not None):
            raise ValueError(f"ScoringBatch.uniform: step {s} says self_conditioned={bool(tr.self_conditioned[0, s])}"
                             " but the replay feeds the previous step's logits only after a canvas's first step")
        if flush is not None and pending == flush.steps:  # a new chunk: its own encoder pass, hence its own graph
            flush(out)
            ctx, pending = group_context(hf, batch, rows)[0], 0
            for done in range(k):
                ctx.append(batch.completion_ids[idx.to(batch.completion_ids.device), done * span:(done + 1) * span]
                           .to(device))
        pending += 1
        cols = slice(k * span, (k + 1) * span)
        hidden = ctx.hidden(tr.canvas[:, s, cols].long(), self_cond)
        head = _Head(hf, temps[0, s])
        r, p = torch.nonzero(tr.accepted[:, s, cols] & counted[:, s, None], as_tuple=True)
        logp = selected_logprobs(hidden[r, p], head, tr.sampled[:, s, cols].long()[r, p], chunk_size)
        out["index"].append((idx[r] * n_steps + s) * g_len + k * span + p)
        out["logp"].append(logp)
        out["forwards"] += len(rows)
        out["calls"] += 1
        out["anchor"] = hidden
        following = s + 1 < n_steps and int(tr.canvas_index[0, s + 1]) == k and bool(counted[:, s + 1].any())
        if following:  # the next step's self-conditioning input: this step's tempered logits, without gradient
            with torch.no_grad():
                logits = head(hidden.detach())
                if self_cond is not None and bool(tr.stopped[:, s].any()):  # stopped rows carry theirs
                    logits = torch.where(tr.stopped[:, s, None, None], self_cond.to(logits.dtype), logits)
                self_cond = logits.to(ctx.embedding_dtype)
    if flush is not None and pending:
        flush(out)


class StepFlush:
    """Back-propagates ``sum(logp * grad)`` over the (flat index, log-prob) pairs a replay has gathered in ``out``
    (then drops them), ``steps`` scored steps at a time; ``backward(term, last)`` is told the last of ``chunks``."""

    def __init__(self, grad: torch.Tensor, steps: int, chunks: int, backward: Callable[[torch.Tensor, bool], None]):
        self.grad, self.steps, self.left, self.backward = grad.reshape(-1), steps, chunks, backward

    def __call__(self, out: dict) -> None:
        index, logp = torch.cat(out["index"]), torch.cat(out["logp"])
        out["index"], out["logp"] = [], []
        self.left -= 1
        self.backward((logp.float() * self.grad[index]).sum(), self.left == 0)


def backward_by_steps(model, batch: ScoringBatch, grad: torch.Tensor, steps: int,
                      backward: Callable[[torch.Tensor, bool], None], chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Back-propagate ``sum(logp * grad)`` (``grad`` shaped as the scores' ``logp``: ``dloss / dlogp`` of a loss of
    these scores) through the replay of ``batch``, ``steps`` scored steps of a group at a time. Each chunk's graph
    (its encoder pass over the prompt and the kept canvases, its decoder steps) is freed by its backward before the
    next is built, so memory is one chunk's, whatever the trajectory's length; the self-conditioning inputs carry
    no gradient (module notes), so the chunks' gradients sum to the all-at-once one. Returns the chunks."""
    trace = batch.uniform
    if trace is None:
        raise ValueError("backward_by_steps needs ScoringBatch.uniform (a uniform-state rollout's trajectory)")
    groups = schedule_groups(trace)
    lives = [len(live_steps(trace.select(torch.tensor(rows, device=trace.step.device)))) for rows in groups]
    chunks = sum(-(-n // steps) for n in lives)
    flush = StepFlush(grad.to(model.hf_model.device), steps, chunks, backward)
    out: dict = {"index": [], "logp": [], "forwards": 0, "calls": 0, "anchor": None}
    for rows in groups:
        _replay_group(model, batch, rows, chunk_size, out, flush)
    return chunks


def trajectory_scores(model, batch: ScoringBatch, chunk_size: int = DEFAULT_CHUNK_SIZE) -> TokenScores:
    """The module's scores of ``batch`` (``batch.uniform`` holds the trajectories) under ``model``."""
    trace = batch.uniform
    if trace is None:
        raise ValueError("the trajectory estimator needs ScoringBatch.uniform (a uniform-state rollout's trajectory, "
                         "Rollout.uniform)")
    out: dict = {"index": [], "logp": [], "forwards": 0, "calls": 0, "anchor": None}
    for rows in schedule_groups(trace):
        _replay_group(model, batch, rows, chunk_size, out)
    n_steps, g_len, bsz = trace.step.shape[1], batch.completion_len, batch.batch_size
    device = model.hf_model.device
    flat = torch.zeros(bsz * n_steps * g_len, device=device)
    index = torch.cat(out["index"]) if out["index"] else torch.zeros(0, dtype=torch.long, device=device)
    values = torch.cat(out["logp"]) if out["logp"] else flat.new_zeros(0)
    logp = flat.index_put((index,), values.float())
    if not len(index) and torch.is_grad_enabled() and out["anchor"] is not None:  # keep a graph for backward
        logp = logp + 0.0 * out["anchor"].float().sum()
    weight = flat.detach().clone().index_fill_(0, index, 1.0).view(bsz, n_steps, g_len)
    if batch.loss_mask is not None:
        weight = weight * batch.loss_mask.to(weight)[:, None, :]
    step_id = trace.counted_index().to(device)[..., None].expand(bsz, n_steps, g_len)
    transition = torch.where(weight > 0, step_id, -1)
    return TokenScores(logp=logp.view(1, bsz, n_steps * g_len), weight=weight.view(1, bsz, n_steps * g_len),
                       forwards=out["forwards"], forward_tokens=out["forwards"] * trace.canvas_length,
                       calls=out["calls"], info={"transition": transition.reshape(1, bsz, n_steps * g_len)})


@register_uniform("trajectory", counterpart="trace", check=check_trajectory_options)
def score_trajectory(model, batch: ScoringBatch, generator: torch.Generator | None = None, *, shrinkage: int = 1,
                     logprob_chunk_size: int = DEFAULT_CHUNK_SIZE) -> TokenScores:
    """TraceRL's trajectory log-probability (arXiv 2509.06949) for a uniform-state family: per counted step the
    log-probs of the accepted draws under the step's tempered distribution, given its canvas and the replayed
    self-conditioning input (module notes). Deterministic: ``generator`` is accepted for the common signature and
    not used. ``shrinkage``: 1 only. ``logprob_chunk_size``: scored positions projected onto the vocabulary at a
    time."""
    check_trajectory_options(shrinkage=shrinkage, logprob_chunk_size=logprob_chunk_size)
    return trajectory_scores(model, batch, logprob_chunk_size)
