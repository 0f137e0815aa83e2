"""A uniform-state sampler's record as a :class:`~dllm_rl.sampling.Rollout` (DiffusionGemma): the kept canvases up to
and including the first EOS (any of the model's ``eos_token_ids``) as the completion, the forward passes as ``nfe``,
the trajectory as ``Rollout.uniform`` and its ``step_map`` (:mod:`dllm_rl.sampling.uniform_rollout`). The front door
(:func:`dllm_rl.sampling.batched.generate_uniform`) and the engine (:mod:`dllm_rl.sampling.uniform_engine`, a batch
of one per request) build their rollouts here, above both the Rollout type and the trace it carries."""

from __future__ import annotations

import torch

from dllm_rl.models.eos import eos_mask
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sampling.uniform import UniformDecodeConfig, UniformRollout
from dllm_rl.sampling.uniform_rollout import UniformTrace, uniform_step_map


def to_uniform_rollout(model, record: UniformRollout, config, cfg: UniformDecodeConfig, tokenizer=None):
    """The :class:`~dllm_rl.sampling.Rollout` of a sampler's record (module notes): the front door's and the
    engine's (:mod:`~dllm_rl.sampling.uniform_engine`, a batch of one per request)."""
    pad, bsz = model.pad_token_id, record.prompt_ids.shape[0]
    comp = torch.full((bsz, config.gen_length), pad, dtype=torch.long, device=record.sequences.device)
    comp[:, :record.completion_ids.shape[1]] = record.completion_ids
    is_eos = eos_mask(comp, model.eos_token_ids)  # any of them ends the answer
    answer = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
    trace = UniformTrace.from_steps(record.steps, model.layout_block(), config.gen_length, pad, cfg)
    step_map = uniform_step_map(trace, comp)
    if config.stop_on_eos:
        step_map = step_map.masked_fill(~answer, -1)
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(comp[b][answer[b] & ~is_eos[b]].tolist(), skip_special_tokens=True)
                 for b in range(bsz)]
    return Rollout(prompt_ids=record.prompt_ids, prompt_mask=record.attention_mask, completion_ids=comp,
                   completion_mask=answer, step_map=step_map, nfe=record.forward_passes.clone(),
                   finish_reason=["eos" if bool(r) else "length" for r in is_eos.any(-1).tolist()], texts=texts,
                   pad_token_id=pad, uniform=trace)


__all__ = ["to_uniform_rollout"]
