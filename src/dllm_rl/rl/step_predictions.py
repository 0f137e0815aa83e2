"""Rewarding a decoding step's prediction: the rollouts' recorded step predictions as completions.

Rollouts decoded with ``record_steps`` (:mod:`dllm_rl.sampling.step_record`) hold, per step, the state before it
with the step's prediction at every slot the block still had masked. MDPO rewards every step's sampled prediction
(:mod:`dllm_rl.rl.methods.mdpo`); EGSPO rewards the greedy one-step completion at its selected steps
(:mod:`dllm_rl.rl.methods.egspo`). Both turn (sample, step) pairs into rows whose completion is that prediction
(:func:`step_rollout`) and reward them through the round's own reward call.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dllm_rl.models.eos import eos_mask, first_eos
from dllm_rl.sampling import Rollout


def prediction_texts(tokens: torch.Tensor, tokenizer, eos: int | tuple[int, ...], pad: int, mask: int) -> list[str]:
    """Each row's prediction as the answer's text: its tokens before the first EOS (any of ``eos``), mask and pad ids
    dropped
    (later blocks' slots still masked), special tokens skipped, as rollouts' texts are decoded."""
    out = []
    for row in tokens.tolist():
        ids = row[:first_eos(row, eos)]  # (None: the whole row)
        out.append(tokenizer.decode([i for i in ids if i not in (mask, pad)], skip_special_tokens=True))
    return out


def without_steps(rollout: Rollout, **changes) -> Rollout:
    """``rollout`` (with ``changes``) without its recorded step predictions (``step_tokens`` / ``step_masked`` /
    ``step_confidence``): once rewarded, nothing downstream reads them."""
    return replace(rollout, step_tokens=None, step_masked=None, step_confidence=None, **changes)


def step_rollout(rollout: Rollout, rows: list[int], steps: list[int], tokenizer, eos: int | tuple[int, ...],
                 mask: int) -> Rollout:
    """One row per pair ``(rows[k], steps[k])`` of ``rollout``, with that step's prediction as its completion (to
    reward it): the answer is the prediction up to its first EOS (any of ``eos``); the slots predicted at the step
    carry it in ``step_map``."""
    if len(rows) != len(steps):
        raise ValueError(f"step_rollout: {len(rows)} rows and {len(steps)} steps")
    sub = rollout.select(rows)
    idx, t = torch.arange(len(rows)), torch.as_tensor(steps, dtype=torch.long)
    tokens = sub.step_tokens[idx, t].long()
    masked = sub.step_masked[idx, t]
    is_eos = eos_mask(tokens, eos)
    answer = (is_eos.long().cumsum(-1) - is_eos.long() == 0) & (tokens != mask) & ((tokens != sub.pad_token_id)
                                                                                   | is_eos)
    texts = prediction_texts(tokens, tokenizer, eos, sub.pad_token_id, mask)
    return without_steps(sub, completion_ids=tokens, completion_mask=answer, texts=texts,
                         step_map=torch.where(masked, t[:, None].to(sub.step_map.device), sub.step_map))
