"""``score_rows`` with chunking off (``logprob_chunk_size=0``) asks the LM head for the scored columns only;
scores equal those of full logits exactly. (The chunked path: ``test_estimator_chunked_logprobs.py``.)"""

from __future__ import annotations

import types

import pytest
import torch
from conftest import FAMILIES, gen, make_batch

from dllm_rl.estimators import estimate
from dllm_rl.models import DiffusionLM

NAMES = ("trace", "elbo", "mean_field", "random_mask", "coupled")


def _full_head_forward(self, *args, logits_to_keep=None, **kwargs):
    """The behaviour before ``logits_to_keep``: project every column, then slice."""
    out = DiffusionLM.forward(self, *args, **kwargs)
    if logits_to_keep:
        out.logits = out.logits[:, -int(logits_to_keep):]
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", NAMES)
def test_scores_equal_full_logits_and_lm_head_skips_the_prompt(models, monkeypatch, family, name):
    model = models[family]
    batch = make_batch(seed=2)
    opts = {"max_rows": 3, "logprob_chunk_size": 0}
    seen: list[int] = []
    handle = model.hf_model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        with torch.no_grad():
            new = estimate(model, name, batch, gen(11), **opts)
    finally:
        handle.remove()
    with monkeypatch.context() as m, torch.no_grad():
        m.setattr(model, "forward", types.MethodType(_full_head_forward, model))
        old = estimate(model, name, batch, gen(11), **opts)
    assert torch.equal(new.logp, old.logp) and torch.equal(new.weight, old.weight)
    assert (new.forwards, new.forward_tokens, new.calls) == (old.forwards, old.forward_tokens, old.calls)
    # P = 5, G = 8: single-stream rows project at most the 8 completion columns (Dream: + the column before);
    # the two-stream rows of sdar at most the noisy copy (<= 12 = the prompt's last block + G).
    two_stream = family == "sdar"  # block models: every estimator runs the two-stream layout
    limit = 12 if two_stream else 8 + (1 if family == "dream" else 0)
    assert seen and max(seen) <= limit, seen
    if not two_stream:  # forward_tokens still counts model input columns, not kept ones
        assert new.forward_tokens == new.forwards * (5 + 8)
