"""The decoding loop: block by block, step by step, commit the most confident masked tokens.

One loop serves every model and cache (the :class:`~dllm_rl.sampling.runner.ModelRunner` hides the
difference). Per block, every live row runs steps until its block slots are all committed; a step is one
forward pass that commits, for each row still holding masks in the block:

* static schedule (``steps``): LLaDA's low-confidence remasking (Nie et al. 2025, arXiv 2502.09992;
  reference ``generate``): ``transfer_counts`` tokens, highest confidence first, ties to the lower
  position; zero-token steps (more steps than masks) are skipped rather than spent;
* dynamic schedule (``threshold``): every masked token with confidence > threshold, at least one
  (Fast-dLLM confidence-aware parallel decoding, Wu et al. 2025, arXiv 2505.22618; SDAR
  ``low_confidence_dynamic``); with ``sub_block`` only in the block's first sub-block that still holds
  masks (Fast-dLLM v2);
* RCR (``remasking="rcr"``, MDPO's Running-Confidence Remasking, He et al. 2025, arXiv 2508.13148): on the
  static schedule each step fills every masked slot of the block, then re-masks the block's slots of lowest
  running confidence (:func:`~dllm_rl.sampling.confidence.rcr_remask`) so that as many stay as the schedule has
  committed so far; a committed token can be re-masked and re-predicted later. ``step_map`` is then the step of
  a token's last commit, ``confidence`` its score then.

A row's step counter (= its NFE so far) stamps ``step_map``. A row that is not active in a step (its block
is done while neighbours still decode) draws no random numbers and spends no NFE, so its trace is the same
alone or in any batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from dllm_rl.models import DiffusionLM
from dllm_rl.models.eos import eos_mask
from dllm_rl.sampling.canvas import Canvas
from dllm_rl.sampling.confidence import (
    choose_tokens,
    current_sub_block,
    left_after,
    rcr_remask,
    select_commits,
    transfer_counts,
)
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sampling.runner import ModelRunner
from dllm_rl.sampling.step_record import StepRecorder


@contextmanager
def evaluating(model: DiffusionLM) -> Iterator[None]:
    """``model`` in eval mode for the block, and back in training mode after if it was. A no-op when it already is in
    eval mode: switching walks every submodule (~6% of a continuous-batching run's time on the demo model when
    done each step)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def runner_mode(model: DiffusionLM, config: DecodeConfig, block_cache: bool = True) -> str:
    if model.is_block_causal:
        return "block" if block_cache else "block_none"
    return config.cache


def decode(
    model: DiffusionLM,
    canvas: Canvas,
    config: DecodeConfig,
    generators: list[torch.Generator],
    *,
    block_cache: bool = True,
    progress: bool = False,
    recorder: StepRecorder | None = None,
    until_block: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Run the loop on ``canvas`` in place; return ``step_map``/``confidence``/``entropy`` ``[B, T]`` and ``nfe``
    ``[B]``.

    ``block_cache=False`` runs block models without their KV cache (the exact reference path); ``recorder`` keeps
    every step's full prediction (:mod:`dllm_rl.sampling.step_record`). ``until_block``
    (``[B]``, optional): row ``b`` decodes only its blocks ``j < until_block[b]`` and leaves the later slots
    masked (a partial state, e.g. a tree rollout's inner node); the blocks it decodes are decoded as without it.
    """
    bsz, width = canvas.x.shape
    device = canvas.x.device
    runner = ModelRunner(model, canvas, runner_mode(model, config, block_cache))
    step_map = torch.full((bsz, width), -1, dtype=torch.long, device=device)
    conf_map = torch.zeros((bsz, width), dtype=torch.float32, device=device)
    ent_map = torch.zeros((bsz, width), dtype=torch.float32, device=device)
    nfe = torch.zeros(bsz, dtype=torch.long, device=device)
    stopped = torch.zeros(bsz, dtype=torch.bool, device=device)
    steps = config.steps or canvas.block
    needs_rng = config.temperature > 0 or config.confidence == "random"
    eos, pad = model.eos_token_ids, model.pad_token_id
    rcr = config.remasking == "rcr"
    bar = _progress_bar(canvas.num_blocks, progress)
    live = torch.arange(bsz, device=device)
    for j in range(canvas.num_blocks):
        s, e = canvas.cols(j)
        live = live[(canvas.comp_end[live] > s) & ~stopped[live]]
        if until_block is not None:
            live = live[until_block[live] > j]
        if live.numel() == 0:
            break
        runner.begin_block()
        runner.set_rows(live)
        masked0 = canvas.todo[live, s:e].sum(-1)
        drawn = canvas.todo[live, s:e].clone()  # the slots this block decodes (RCR may re-mask only these)
        t = 0
        while True:
            todo = canvas.todo[live, s:e]
            active = todo.any(-1)
            if not active.any():
                break
            logits = runner.logits(s, e, active)
            rows = live[active]
            gens = [generators[r] for r in rows.tolist()] if needs_rng else None
            tokens, conf, ent = choose_tokens(logits, config.temperature, config.top_k, config.top_p, config.confidence,
                                         gens)
            if recorder is not None:
                recorder.add(rows, nfe[rows], s, e, logits.argmax(-1) if recorder.greedy else tokens, conf)
            del logits
            chosen = step_commits(config, conf, todo[active], masked0[active], steps, t)
            r_idx, c_idx = chosen.nonzero(as_tuple=True)
            rr, cc = rows[r_idx], c_idx + s
            canvas.x[rr, cc] = tokens[r_idx, c_idx]
            canvas.todo[rr, cc] = False
            step_map[rr, cc] = nfe[rr]
            conf_map[rr, cc] = conf[r_idx, c_idx].float()
            ent_map[rr, cc] = ent[r_idx, c_idx].float()
            if rcr:
                back = rcr_remask(conf_map[rows, s:e].double(), drawn[active], left_after(masked0[active], steps, t))
                r_idx, c_idx = back.nonzero(as_tuple=True)
                rr, cc = rows[r_idx], c_idx + s
                canvas.x[rr, cc] = model.mask_token_id
                canvas.todo[rr, cc] = True
                step_map[rr, cc] = -1
                conf_map[rr, cc] = 0.0
                ent_map[rr, cc] = 0.0
            nfe[rows] += 1
            t += 1
        if config.stop_on_eos:
            _stop_finished(canvas, live, s, e, eos, pad, stopped)
        bar.update(1)
    bar.close()
    return {"step_map": step_map, "confidence": conf_map, "entropy": ent_map, "nfe": nfe}


def step_commits(config: DecodeConfig, conf: torch.Tensor, todo: torch.Tensor, masked0: torch.Tensor, steps: int,
                 t: int | torch.Tensor) -> torch.Tensor:
    """The slots one step commits (``[n, L]`` bool) among the block's masked slots ``todo``: all of them under RCR
    (its re-masking then takes some back), else the threshold's or the static schedule's most confident (``t``: the
    local step, one for all rows or ``[n]``; ``masked0``: the masks each block began with). The engine's rule too."""
    if config.remasking == "rcr":
        return todo
    candidates = current_sub_block(todo, config.sub_block) if config.sub_block is not None else todo
    if config.threshold is not None:
        return select_commits(conf, candidates, threshold=config.threshold)
    return select_commits(conf, candidates, counts=transfer_counts(masked0, steps, t))


def _stop_finished(canvas: Canvas, live: torch.Tensor, s: int, e: int, eos: tuple[int, ...], pad: int,
                   stopped: torch.Tensor) -> None:
    """Rows whose just-finished block holds only EOS (any of ``eos``) / pad in its completion slots stop; the first
    EOS id fills the rest."""
    cols = torch.arange(s, e, device=canvas.x.device)[None, :]
    in_comp = (cols >= canvas.comp_start[live, None]) & (cols < canvas.comp_end[live, None])
    blk = canvas.x[live, s:e]
    done = (eos_mask(blk, eos) | (blk == pad) | ~in_comp).all(-1)
    for r in live[done].tolist():
        c1 = int(canvas.comp_end[r])
        canvas.x[r, e:c1] = eos[0]
        canvas.todo[r, e:c1] = False
        stopped[r] = True


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="decode blocks", unit="block", disable=not enabled, leave=False)


def to_rollout(canvas: Canvas, trace: dict[str, torch.Tensor], model: DiffusionLM, tokenizer=None) -> Rollout:
    """Cut the canvas into a :class:`Rollout` (completion columns left-aligned, see ``sampling`` docs)."""
    pad = model.pad_token_id
    bsz = canvas.x.shape[0]
    slots = canvas.completion_slots()
    comp = canvas.gather_completion(canvas.x, pad)
    is_eos = eos_mask(comp, model.eos_token_ids) & slots  # any of the model's EOS ids ends the answer
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()
    p_width = int(canvas.prompt_len.max().item())
    p_idx = canvas.comp_start[:, None] - canvas.comp_start.new_tensor(range(p_width, 0, -1))[None, :]
    p_mask = canvas.comp_start.new_tensor(range(p_width))[None, :] >= (p_width - canvas.prompt_len)[:, None]
    prompt = torch.where(p_mask, canvas.x.gather(1, p_idx.clamp(min=0)), torch.full_like(p_idx, pad))
    completion_ids = comp
    texts = None
    if tokenizer is not None:
        texts = []
        for b in range(bsz):
            ids = completion_ids[b][slots[b] & (eos_before[b] == 0) & ~is_eos[b]].tolist()
            texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return Rollout(
        prompt_ids=prompt,
        prompt_mask=p_mask,
        completion_ids=completion_ids,
        completion_mask=slots & (eos_before == 0),
        step_map=canvas.gather_completion(trace["step_map"], -1),
        nfe=trace["nfe"].clone(),
        finish_reason=["eos" if bool(r) else "length" for r in is_eos.any(-1).tolist()],
        texts=texts,
        confidence=canvas.gather_completion(trace["confidence"], 0.0),
        entropy=canvas.gather_completion(trace["entropy"], 0.0),
        pad_token_id=pad,
        step_tokens=trace.get("step_tokens"),
        step_masked=trace.get("step_masked"),
        step_confidence=trace.get("step_confidence"),
    )
