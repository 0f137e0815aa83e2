"""Chunked selected log-probs: the values and gradients of ``log_softmax(head(h)).gather`` without the full
``[N, V]`` logits, and the model's hidden-state forward that feeds them (Dream's shift included)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dllm_rl.models import build_model, tiny_config
from dllm_rl.models.logprobs import selected_logprobs

N, H, V = 11, 8, 40


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.5)
    hidden = torch.randn(N, H, generator=g).requires_grad_(True)
    targets = torch.randint(0, V, (N,), generator=g)
    upstream = torch.randn(N, generator=g)
    return head, hidden, targets, upstream


def _grads(fn, head, hidden, targets, upstream):
    head.zero_grad(set_to_none=True)
    hidden.grad = None
    lp = fn(hidden, head, targets)
    (lp * upstream).sum().backward()
    return lp.detach(), hidden.grad.clone(), head.weight.grad.clone()


def _full(hidden, head, targets):
    return torch.log_softmax(head(hidden).float(), -1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64, 0])  # 3 and 4 do not divide N = 11
def test_values_and_gradients_equal_the_full_log_softmax(chunk):
    head, hidden, targets, upstream = _inputs()
    want = _grads(_full, head, hidden, targets, upstream)
    got = _grads(lambda h, m, t: selected_logprobs(h, m, t, chunk), head, hidden, targets, upstream)
    assert got[0].dtype == torch.float32 and got[0].shape == (N,)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert float(want[0].max()) < 0 and float(want[2].abs().sum()) > 1.0  # real values, real gradients


def test_only_one_chunk_of_logits_exists_in_forward_and_backward():
    head, hidden, targets, upstream = _inputs(1)
    shapes: list[tuple[int, ...]] = []
    head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    lp = selected_logprobs(hidden, head, targets, 4)
    assert shapes == [(4, V), (4, V), (3, V)]
    (lp * upstream).sum().backward()  # backward recomputes each chunk, one at a time
    assert sorted(shapes[3:]) == sorted(shapes[:3])


def test_no_grad_does_not_recompute_and_bad_arguments_are_named():
    head, hidden, targets, _ = _inputs(2)
    with torch.no_grad():
        got = selected_logprobs(hidden, head, targets, 5)
    torch.testing.assert_close(got, _full(hidden, head, targets).detach(), atol=1e-6, rtol=0)
    assert selected_logprobs(hidden[:0], head, targets[:0], 5).shape == (0,)
    with pytest.raises(ValueError, match=r"chunk_size must be an int >= 0 .* got -1"):
        selected_logprobs(hidden, head, targets, -1)
    with pytest.raises(ValueError, match=r"hidden must be \[N, H\] and targets \[N\], got \(11, 8\) and \(3,\)"):
        selected_logprobs(hidden, head, targets[:3], 5)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_hidden_states_through_the_head_equal_the_logits(family):
    """``hidden[r, raw_columns(r, c)]`` through ``lm_head`` equals ``forward().logits[r, c]`` at every column,
    left padding included (Dream: a row's first real token reads its own raw column)."""
    cfg = tiny_config(family, vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, block_size=4)
    model = build_model(family, cfg, seed=3)
    ids = torch.randint(0, 46, (3, 9), generator=torch.Generator().manual_seed(4))
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, :3] = False
    valid[2, :1] = False
    with torch.no_grad():
        logits = model(ids, attention_mask=valid).logits
        out = model(ids, attention_mask=valid, return_hidden=True)
        assert out.logits is None and out.last_raw_logits is None and out.hidden.shape == (3, 9, 32)
        rows, cols = torch.meshgrid(torch.arange(3), torch.arange(9), indexing="ij")
        raw = model.raw_columns(rows, cols, valid)
        got = model.lm_head(out.hidden[rows, raw])
    torch.testing.assert_close(got, logits, atol=1e-6, rtol=0)
    if family == "dream":
        assert raw[1].tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 7]  # padding and the first real token (3) read their own
        assert model.raw_columns(rows, cols)[1].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    else:
        assert torch.equal(raw, cols)
    with pytest.raises(ValueError, match="return_hidden returns every column; drop logits_to_keep"):
        model(ids, attention_mask=valid, return_hidden=True, logits_to_keep=2)
