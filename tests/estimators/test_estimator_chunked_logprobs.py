"""The scorer's chunked LM head: every estimator's scores and gradients equal chunking off, the head never
projects more than one chunk of positions, and gradient checkpointing gives the same gradients in every
layout (full attention, block-causal, two-stream)."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, VOCAB, gen, make_batch, tiny

from dllm_rl.estimators import estimate
from dllm_rl.models.diffusion_lm import Selection

# (family, estimator, options): every estimator on every family that runs it.
CASES = [(f, n, {}) for f in FAMILIES for n in ("trace", "elbo", "mean_field", "random_mask", "coupled")]
CASES += [("llada", "block", {"block_size": 4}), ("dream", "block", {"block_size": 4}), ("sdar", "block", {})]
CASES += [("llada", "ar", {}), ("dream", "ar", {})]


@pytest.fixture(scope="module")
def fresh():
    return {f: tiny(f, seed=1) for f in FAMILIES}


def _score_and_grads(model, name, batch, opts, chunk):
    model.zero_grad(set_to_none=True)
    sc = estimate(model, name, batch, gen(5), logprob_chunk_size=chunk, **opts)
    (sc.weight * sc.logp).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return sc, grads


@pytest.mark.parametrize(("family", "name", "opts"), CASES, ids=[f"{f}-{n}" for f, n, _ in CASES])
def test_chunked_scores_and_gradients_equal_chunking_off(fresh, family, name, opts):
    model = fresh[family]
    batch = make_batch(seed=3)
    off, g_off = _score_and_grads(model, name, batch, opts, 0)
    on, g_on = _score_and_grads(model, name, batch, opts, 3)  # 3 divides no row's count of scored tokens
    assert torch.equal(on.weight, off.weight) and on.weight.ne(0).sum() > 3
    torch.testing.assert_close(on.logp, off.logp, atol=1e-6, rtol=0)
    assert float(off.logp.detach()[off.weight != 0].max()) < 0
    assert (on.forwards, on.forward_tokens, on.calls) == (off.forwards, off.forward_tokens, off.calls)
    assert g_on.keys() == g_off.keys() and {"model.lm_head.weight", "model.model.embed_tokens.weight"} <= set(g_on)
    for k in g_off:  # float32 round-off only: within 1e-6 of the gradient's own scale (up to ~150 here)
        err, scale = float((g_on[k] - g_off[k]).abs().max()), float(g_off[k].abs().max())
        assert err <= 1e-6 * max(scale, 1.0), (k, err, scale)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_head_never_projects_more_than_one_chunk(fresh, family):
    """A wrapper of the LM head's forward records the largest output it produced in forward and backward
    (recomputation): with chunking at most ``chunk x V``; with chunking off the same plan projects far more at
    once."""
    model = fresh[family]
    batch = make_batch(seed=4)
    largest = {}
    plain = model.lm_head.forward

    def record(x):
        out = plain(x)
        largest["rows"] = max(largest.get("rows", 0), out.numel() // out.shape[-1])
        assert out.shape[-1] == VOCAB
        return out

    model.lm_head.forward = record
    try:
        for chunk in (4, 0):
            largest.clear()
            sc = estimate(model, "elbo", batch, gen(2), logprob_chunk_size=chunk, num_mc=2)
            sc.sequence_score().sum().backward()
            if chunk:
                assert largest["rows"] == 4
            else:
                assert largest["rows"] >= 2 * 8  # [rows, kept columns, V] at once
    finally:
        del model.lm_head.forward
    model.zero_grad(set_to_none=True)


def _one_backward(model, run):
    model.zero_grad(set_to_none=True)
    run(model).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _block_causal(model):
    """A plain forward under the family's own block-causal rule, every completion token scored (chunked)."""
    batch = make_batch(seed=6)
    ids, valid = batch.input_ids(), batch.valid()
    b, g = batch.completion_ids.shape
    rows = torch.arange(b).repeat_interleave(g)
    cols = torch.arange(batch.prompt_len, batch.prompt_len + g).repeat(b)
    select = Selection(rows, cols, batch.completion_ids.reshape(-1), 5)
    return model(input_ids=ids, attention_mask=valid, select=select).logprobs.sum()


LAYOUTS = {
    "full-llada": ("llada", lambda m: estimate(m, "elbo", make_batch(6), gen(1), logprob_chunk_size=5)),
    "full-dream": ("dream", lambda m: estimate(m, "elbo", make_batch(6), gen(1), logprob_chunk_size=5)),
    "block-sdar": ("sdar", _block_causal),
    "two-stream-trace": ("sdar", lambda m: estimate(m, "trace", make_batch(6), gen(1), logprob_chunk_size=5)),
    "two-stream-block": ("sdar", lambda m: estimate(m, "block", make_batch(6), gen(1), logprob_chunk_size=5)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients_in_every_layout(layout, reentrant):
    family, fn = LAYOUTS[layout]

    def run(m):
        out = fn(m)
        return out if torch.is_tensor(out) else out.sequence_score().sum()

    model = tiny(family, seed=2)
    model.train()
    plain = _one_backward(model, run)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert model.model.is_gradient_checkpointing
    calls = []
    handle = model.hf_model.model.layers[0].input_layernorm.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        ckpt = _one_backward(model, run)
    finally:
        handle.remove()
    forwards = len(calls) // 2
    assert forwards >= 1 and len(calls) == 2 * forwards  # the layer (hooks outside) is recomputed in backward
    assert ckpt.keys() == plain.keys() and len(plain) == len(list(model.parameters()))
    for k in plain:
        err, scale = float((ckpt[k] - plain[k]).abs().max()), float(plain[k].abs().max())
        assert err <= 1e-7 * max(scale, 1.0), (k, err, scale)
