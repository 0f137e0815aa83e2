"""The sampler's front door: :func:`generate` decodes a batch of prompts (the masked decoding loop of
:mod:`~dllm_rl.sampling.decode`, or a uniform-state family's own sampler, :func:`generate_uniform`), and
:func:`generate_batched` decodes any number of them, a batch at a time or with the continuous-batching
:class:`~dllm_rl.sampling.engine.Engine`. Both are :mod:`dllm_rl.sampling`'s ``generate`` / ``generate_batched``
(the module notes there say what a rollout holds).

The front door lives here, above the loop, the engine and the uniform sampler it chooses between, so that none of
them imports it."""

from __future__ import annotations

import dataclasses
import time

import torch

from dllm_rl.errors import UserError
from dllm_rl.models import DiffusionLM
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.sampling.canvas import apply_prefill, build_canvas
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.decode import decode, evaluating, to_rollout
from dllm_rl.sampling.engine import Engine
from dllm_rl.sampling.engine_api import EngineConfig
from dllm_rl.sampling.inputs import check_inputs, decode_block_length, uniform_decode_config, uniform_noise
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sampling.step_record import StepRecorder
from dllm_rl.sampling.uniform import sample_uniform
from dllm_rl.sampling.uniform_result import to_uniform_rollout


def generate(
    model: DiffusionLM,
    prompts: list[list[int]],
    config: DecodeConfig,
    seeds: list[int] | None = None,
    tokenizer=None,
    progress: bool = False,
    *,
    block_cache: bool = True,
    prefill: list[dict[int, int]] | None = None,
    images: PromptImages | None = None,
    record_steps: str | None = None,
    until_block: list[int] | None = None,
) -> Rollout:
    """Decode a completion for each prompt (token ids, any lengths) and record how it was decoded.

    A uniform-state family (DiffusionGemma) decodes with its own sampler
    (:func:`generate_uniform`), which takes none of the options below but
    ``seeds`` and ``tokenizer``.

    ``images`` (LLaDA-V; one row per prompt, :func:`dllm_rl.models.llava_images.prompt_images`) splices image
    features at their prompt positions in every forward; the rollout keeps them (``Rollout.images``), so scoring
    reuses the same features.

    ``prefill[i]`` (optional; completion offset -> token id) commits those tokens of sequence i before
    decoding (:func:`~dllm_rl.sampling.canvas.apply_prefill`); they get ``step_map`` -1 and
    ``Rollout.prefilled`` marks them. ``until_block[i]``
    (optional) stops sequence i after its first ``until_block[i]`` decoded blocks: the rest of its completion stays
    masked (mask ids, ``step_map`` -1). Blocks whose slots are all prefilled are skipped without a forward, so a
    prefilled partial state continues as the sampler would have continued it (d-TreeRPO's tree rollouts).

    ``seeds[i]`` seeds sequence i's own ``torch.Generator`` (default ``config.seed + i``). The model is put
    in eval mode for the call and restored afterwards. ``block_cache=False`` disables the (exact) block
    cache of block models — the slow reference path, for tests and benchmarks. ``record_steps`` (``"sampled"``:
    the step's sampled tokens, MDPO; ``"greedy"``: the argmax of its logits, EGSPO) keeps every step's full
    prediction in the rollout (``step_tokens`` / ``step_masked`` / ``step_confidence``,
    :mod:`dllm_rl.sampling.step_record`).
    """
    prompts = check_inputs(model, prompts, config, seeds, images)
    seeds = list(seeds) if seeds is not None else [config.seed + i for i in range(len(prompts))]
    if uniform_noise(model):  # DiffusionGemma: the uniform-state sampler, recording its trajectory
        return generate_uniform(model, prompts, config, seeds, tokenizer, block_cache=block_cache, prefill=prefill,
                                images=images, record_steps=record_steps, until_block=until_block)
    device = model.device
    images = images.to(device) if images is not None else None
    canvas = build_canvas(prompts, config.gen_length, decode_block_length(model, config), model.is_block_causal,
                          model.mask_token_id, model.pad_token_id, device, images)
    if prefill is not None:
        apply_prefill(canvas, prefill)
    if until_block is not None and len(until_block) != len(prompts):
        raise ValueError(f"until_block has {len(until_block)} entries for {len(prompts)} prompts")
    stop = torch.tensor(until_block, dtype=torch.long, device=device) if until_block is not None else None
    generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    recorder = StepRecorder(canvas, record_steps) if record_steps else None
    with evaluating(model), torch.inference_mode():
        trace = decode(model, canvas, config, generators, block_cache=block_cache, progress=progress,
                       recorder=recorder, until_block=stop)
        if recorder is not None:
            trace.update(recorder.tensors(len(prompts), model.pad_token_id))
    rollout = to_rollout(canvas, trace, model, tokenizer)
    rollout.block_size = canvas.block if model.is_block_causal else None
    rollout.images = images
    if prefill is not None:
        rollout.prefilled = torch.zeros_like(rollout.completion_mask)
        for i, slots in enumerate(prefill):
            rollout.prefilled[i, [int(k) for k in slots]] = True
    return rollout


def generate_batched(
    model: DiffusionLM,
    prompts: list[list[int]],
    config: DecodeConfig,
    seeds: list[int] | None = None,
    tokenizer=None,
    batch_size: int = 32,
    progress: bool = False,
    prefill: list[dict[int, int]] | None = None,
    images: PromptImages | None = None,
    engine=None,
    record_steps: str | None = None,
    until_block: list[int] | None = None,
    thresholds: list[float] | None = None,
) -> Rollout:
    """:func:`generate` over ``batch_size`` prompts at a time, concatenated in order (same result per prompt:
    sequence i keeps seed ``seeds[i]`` / ``config.seed + i`` whatever batch it lands in). ``images`` are
    encoded already: every batch reuses their features.

    ``engine`` (an :class:`~dllm_rl.sampling.engine.EngineConfig`) decodes with the continuous-batching engine
    instead, ``engine.slots`` sequences at a time (``batch_size`` is then unused). Both give every prompt the
    tokens it gets alone, so the rollout is the same (``engine.early_stop`` aside). ``prefill``,
    ``until_block`` and ``record_steps``: see :func:`generate`.

    ``thresholds[i]`` decodes prompt ``i`` with the dynamic schedule at its own threshold (a learned per-prompt
    threshold, :mod:`~dllm_rl.sampling.threshold_head`): the rows then go through the engine (``batch_size`` slots
    unless ``engine`` says), whose requests each carry their own decoding rules, with the tokens each prompt gets
    decoded alone at its threshold."""
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    prompts = check_inputs(model, prompts, config, seeds, images)
    seeds = list(seeds) if seeds is not None else [config.seed + i for i in range(len(prompts))]
    configs = per_prompt_configs(model, config, thresholds, len(prompts))
    if configs is not None and engine is None:
        engine = EngineConfig(slots=batch_size)
    if engine is not None:
        t0 = time.perf_counter()
        rollout = Engine(model, config, engine, tokenizer).run(prompts, seeds, images, prefill, record_steps or None,
                                                               until_block, **({"configs": configs} if configs else {}))
        if progress:
            tokens = int(rollout.completion_mask.sum())
            print(f"generate: {len(prompts)} prompts, {tokens} tokens, "
                  f"{tokens / max(time.perf_counter() - t0, 1e-9):.1f} tok/s ({engine.slots} slots)", flush=True)
        return rollout
    parts, t0, done = [], time.perf_counter(), 0
    for b0 in range(0, len(prompts), batch_size):
        chunk = slice(b0, b0 + batch_size)
        parts.append(generate(model, prompts[chunk], config, seeds[chunk], tokenizer,
                              prefill=prefill[chunk] if prefill is not None else None,
                              images=images.select(chunk) if images is not None else None,
                              record_steps=record_steps,
                              until_block=until_block[chunk] if until_block is not None else None))
        done += len(parts[-1])
        if progress:
            tokens = int(sum(p.completion_mask.sum() for p in parts))
            rate = tokens / max(time.perf_counter() - t0, 1e-9)
            print(f"generate: {done}/{len(prompts)} prompts, {tokens} tokens, {rate:.1f} tok/s", flush=True)
    return Rollout.cat(parts)


def per_prompt_configs(model: DiffusionLM, config: DecodeConfig, thresholds: list[float] | None,
                       n: int) -> list[DecodeConfig] | None:
    """``config`` with each prompt's own dynamic-schedule threshold (None without ``thresholds``)."""
    if thresholds is None:
        return None
    if len(thresholds) != n:
        raise ValueError(f"thresholds has {len(thresholds)} entries for {n} prompts")
    if uniform_noise(model):
        raise UserError(f"learned thresholds: {model.family.name} is uniform-state diffusion, whose sampler has no "
                        "confidence threshold; decode it with its own schedule")
    if config.remasking == "rcr":
        raise UserError("learned thresholds: rcr re-masks on the static schedule; use remasking=low_confidence")
    return [dataclasses.replace(config, steps=None, threshold=float(t)) for t in thresholds]


def _refuse_extras(name: str, **given) -> None:
    for key, value in given.items():
        if value:
            raise UserError(f"generate: {key} is not supported for {name} (uniform-state diffusion): its sampler "
                            "decodes whole canvases from random ids, with no mask to prefill, stop or record")


def generate_uniform(model, prompts: list[list[int]], config, seeds: list[int], tokenizer=None, *,
                     block_cache: bool = True, prefill=None, images=None, record_steps=None, until_block=None):
    """:func:`dllm_rl.sampling.generate` for a uniform-state family (checked inputs, one seed per prompt): each row
    draws from its own generator, so it gets the tokens it gets alone, the stock sampler's under that seed."""
    _refuse_extras(model.family.name, prefill=prefill is not None, images=images is not None,
                   record_steps=bool(record_steps), until_block=until_block is not None,
                   **{"block_cache=False": not block_cache})
    cfg = uniform_decode_config(config)
    pad, eos, device = model.pad_token_id, list(model.eos_token_ids), model.device
    width = max(len(p) for p in prompts)
    prompt_ids = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):
        prompt_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
        prompt_mask[i, width - len(p):] = True
    generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    with evaluating(model), torch.inference_mode():
        record = sample_uniform(model, prompt_ids, cfg, attention_mask=prompt_mask, generator=generators,
                                eos_token_id=eos if config.stop_on_eos else None,
                                pad_token_id=pad if config.stop_on_eos else None)
    return to_uniform_rollout(model, record, config, cfg, tokenizer)
