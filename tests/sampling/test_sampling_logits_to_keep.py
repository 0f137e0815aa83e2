"""The runner asks for the current block's logits only; decoding is bit-identical to full-vocabulary logits."""

import types

import pytest
import torch

from dllm_rl.models import DiffusionLM
from dllm_rl.sampling import DecodeConfig, generate


def _full_head_forward(self, *args, logits_to_keep=None, **kwargs):
    """Today's behaviour before ``logits_to_keep``: project every position, then slice."""
    out = DiffusionLM.forward(self, *args, **kwargs)
    if isinstance(logits_to_keep, int) and logits_to_keep > 0:
        out.logits = out.logits[:, -logits_to_keep:]
    elif isinstance(logits_to_keep, torch.Tensor):
        out.logits = out.logits[:, logits_to_keep]
    return out


def _lm_head_positions(model):
    seen = []
    handle = model.hf_model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    return seen, handle


@pytest.mark.parametrize("family, cache", [("llada", "none"), ("llada", "prefix"), ("llada", "dual"),
                                           ("dream", "none"), ("dream", "prefix"), ("dream", "dual"),
                                           ("sdar", "none"), ("sdar", "block_none")])
@pytest.mark.parametrize("sampled", [False, True])
def test_kept_logits_decode_exactly_like_full_logits(tiny_models, monkeypatch, family, cache, sampled):
    model = tiny_models[family]
    extra = dict(temperature=0.8, top_k=20, top_p=0.95) if sampled else {}
    kw = {"block_cache": cache != "block_none"}
    cache = "none" if cache == "block_none" else cache
    config = DecodeConfig(gen_length=8, block_length=4, cache=cache, steps=2, stop_on_eos=False, **extra)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 60, (n,), generator=g).tolist() for n in (3, 6, 1)]
    seen, handle = _lm_head_positions(model)
    try:
        new = generate(model, prompts, config, seeds=[7, 8, 9], **kw)
    finally:
        handle.remove()
    with monkeypatch.context() as m:
        m.setattr(model, "forward", types.MethodType(_full_head_forward, model))
        old = generate(model, prompts, config, seeds=[7, 8, 9], **kw)
    assert torch.equal(new.completion_ids, old.completion_ids)
    assert torch.equal(new.step_map, old.step_map)
    assert torch.equal(new.confidence, old.confidence)
    # The widest canvas is 6 + 8 = 14 (16 for sdar's block rounding): the LM head never projects it all.
    width = 4 + (1 if family == "llada" else 0) + (2 if family == "dream" else 0)  # + last column; Dream: + i-1
    assert max(seen) == width, seen
