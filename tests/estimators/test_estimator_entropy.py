"""Predictive entropies of scored tokens (``estimate(..., entropy=True)``, IGPO's filter) and the loss mask
(``ScoringBatch.loss_mask``): tokens that leave the loss keep their place in the masked rows."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, MASK, gen

from dllm_rl.estimators import estimate


def _entropy_by_hand(model, batch) -> torch.Tensor:
    """One plain forward of ``[prompt | completion]`` with every counted completion token masked (mean_field at
    p_mask_prompt=0): ``-sum p log p`` over the whole vocabulary at each counted token, 0 elsewhere."""
    ids = batch.input_ids().clone()
    comp = ids[:, batch.prompt_len:]
    comp[batch.completion_mask] = MASK
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=batch.valid()).logits[:, batch.prompt_len:].float()
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1) * batch.completion_mask


@pytest.mark.parametrize("family", FAMILIES)
def test_entropies_are_chunked_alike_and_are_the_full_vocabulary_entropy(models, batch, family):
    model = models[family]
    opts = {"p_mask_prompt": 0.0}
    with torch.no_grad():
        chunked = estimate(model, "mean_field", batch, gen(0), entropy=True, logprob_chunk_size=2, **opts)
        whole = estimate(model, "mean_field", batch, gen(0), entropy=True, logprob_chunk_size=0, **opts)
    assert torch.equal(chunked.weight, batch.completion_mask.float()[None])
    torch.testing.assert_close(chunked.logp, whole.logp, rtol=0, atol=1e-5)
    h = chunked.logp[0][batch.completion_mask]
    assert bool((h > 0).all()) and bool((h < torch.log(torch.tensor(64.0))).all())
    if not model.is_block_causal:  # full attention: one masked forward by hand
        torch.testing.assert_close(chunked.logp[0], _entropy_by_hand(model, batch), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_loss_mask_unscores_tokens_and_keeps_the_others_exact(models, batch, family):
    model = models[family]
    drop = torch.zeros_like(batch.completion_mask)
    drop[1, [0, 5, 7]] = True  # sample 1 (8 counted) loses 3; sample 2 loses an uncounted token: no change
    drop[2, 6] = True
    with torch.no_grad():
        full = estimate(model, "mean_field", batch, gen(3))
        batch.loss_mask = ~drop
        part = estimate(model, "mean_field", batch, gen(3))
    assert torch.equal(part.weight, full.weight * (~drop).float()[None])
    kept = part.weight != 0
    assert torch.equal(part.logp[kept], full.logp[kept])  # same rows: the dropped tokens are still masked
    assert batch.loss_lengths.tolist() == [6, 5, 3] and batch.lengths.tolist() == [6, 8, 3]
    assert torch.equal(batch.select([1]).loss_mask, ~drop[1:2])
