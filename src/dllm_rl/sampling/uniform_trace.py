"""Scoring a recorded uniform-state rollout (:mod:`dllm_rl.sampling.uniform`): the tempered logits of its steps,
recomputed from the record, and the trajectory log-probability of what the sampler drew and kept.

The behaviour policy of step ``s`` is the distribution the sampler drew from: ``softmax(z_s / T_s)``, where ``z_s``
are the model's logits given that step's canvas ``x_s`` and self-conditioning input (the previous step's tempered
logits, none on a canvas's first step) and ``T_s`` the schedule's temperature. So the temperature applies:

    log pi(trajectory) = sum_s sum_{i in A_s} log softmax(z_s / T_s)[i, y_{s,i}]

over the steps ``s`` a row was counted for (not stopped, not finished), ``A_s`` its accepted positions and
``y_{s,i}`` the ids drawn there. Re-noised positions drew ids too, but their draws were thrown away and do not enter.
The acceptance rule, the re-noising and the kept argmax canvas are functions of the logits and of random ids that do
not depend on the policy, so they add no term.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dllm_rl.sampling.uniform import CanvasContext, UniformDecodeConfig, UniformRollout, UniformStep, temperature


def step_logprob(step: UniformStep, tempered_logits: torch.Tensor) -> torch.Tensor:
    """``[B]`` float32: the sum over the accepted positions of one step of ``log softmax(tempered_logits)`` at the
    drawn ids; zero for rows the step does not count for."""
    logp = torch.log_softmax(tempered_logits.float(), dim=-1).gather(-1, step.sampled[..., None]).squeeze(-1)
    return (logp * step.accepted).sum(dim=-1) * step.active


def trajectory_logprob(steps: list[UniformStep], tempered_logits: list[torch.Tensor] | Iterator[torch.Tensor]
                       ) -> torch.Tensor:
    """``[B]``: the module's ``log pi(trajectory)``, given each step's tempered logits (``z_s / T_s``)."""
    total = None
    for step, logits in zip(steps, tempered_logits, strict=True):
        part = step_logprob(step, logits)
        total = part if total is None else total + part
    if total is None:
        raise ValueError("a rollout without steps has no trajectory log-probability")
    return total


def replay_logits(model: torch.nn.Module, rollout: UniformRollout, cfg: UniformDecodeConfig) -> Iterator[torch.Tensor]:
    """Each recorded step's tempered logits, recomputed: the prompt and then each kept canvas go through the encoder
    as they did while sampling, and each step's decoder input is its recorded canvas with the previous recomputed
    step's logits as self-conditioning (carried unchanged for stopped rows, and cast to the embedding dtype, as the
    sampler fed them). With gradients on, the logits carry them (the policy-gradient path)."""
    model = getattr(model, "hf_model", model)
    ctx = CanvasContext(model, rollout.prompt_ids, rollout.attention_mask)
    width, start = model.config.canvas_length, rollout.prompt_ids.shape[1]
    canvas_index, self_cond = 0, None
    for step in rollout.steps:
        if step.canvas_index != canvas_index:  # a new canvas: encode the one kept before it
            ctx.append(rollout.sequences[:, start + (step.canvas_index - 1) * width: start + step.canvas_index * width])
            canvas_index, self_cond = step.canvas_index, None
        if step.self_conditioned != (self_cond is not None):
            raise ValueError(f"step {step.step} of canvas {step.canvas_index}: the record and the replay disagree on "
                             "self-conditioning (a record of another config?)")
        logits = ctx.decode(step.canvas, self_cond) / temperature(cfg, step.step)
        yield logits
        if self_cond is not None and bool(step.stopped.any()):
            logits = torch.where(step.stopped[:, None, None], self_cond, logits)
        self_cond = logits.to(ctx.embedding_dtype)
