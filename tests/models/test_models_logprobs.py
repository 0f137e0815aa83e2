"""Chunked selected log-probs: the values and gradients of ``log_softmax(head(h)).gather`` without the full
``[N, V]`` logits, and the model's forward that returns them from inside the LM head (Dream's shift included)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dllm_rl.models import build_model, tiny_config
from dllm_rl.models.diffusion_lm import Selection
from dllm_rl.models.logprobs import head_selects, selected_logprobs

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


class _Ops(TorchDispatchMode):
    """Records the shape of every tensor an aten op allocates (its schema gives the output no alias: not a
    view, not an in-place result), in backward too (CPU autograd runs in this thread)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        for t, ret in zip(outs, func._schema.returns):
            if isinstance(t, torch.Tensor) and ret.alias_info is None:
                self.seen.append(tuple(t.shape))
        return out


def _wrapped(head):
    return lambda x: head(x)  # not a plain nn.Linear: the checkpointed path, the head called as a black box


@pytest.mark.parametrize("kind", ["linear", "wrapped"])
def test_only_one_chunk_of_logits_exists_in_forward_and_backward(kind):
    """Forward and backward project 4 + 4 + 3 positions, one chunk at a time, never all 11. The fused path of a
    plain head makes exactly one ``[V, H]`` tensor in backward (the weight gradient it sums into, in place);
    the checkpointed path makes one per chunk (autograd's per-chunk gradients), the memory it costs."""
    head, hidden, targets, upstream = _inputs(1)
    fn = head if kind == "linear" else _wrapped(head)
    with _Ops() as ops:
        lp = selected_logprobs(hidden, fn, targets, 4)
    logits = [shape for shape in ops.seen if shape[-1:] == (V,)]
    assert logits and set(logits) == {(4, V), (3, V)}
    with _Ops() as ops:
        (lp * upstream).sum().backward()
    logits = [shape for shape in ops.seen if shape[-1:] == (V,)]
    assert logits and set(logits) == {(4, V), (3, V)}
    if kind == "linear":  # one buffer per chunk: the logits become the softmax, then their gradient, in place
        assert logits == [(4, V), (4, V), (3, V)]
    weight_sized = ops.seen.count((V, H))
    assert weight_sized == 1 if kind == "linear" else weight_sized >= 3, weight_sized


@pytest.mark.parametrize("kind", ["bias", "wrapped", "bf16", "autocast"])
def test_the_fused_head_matches_autograd_with_a_bias_in_bf16_and_under_autocast(kind):
    """The fused path (``bias``, ``bf16``, ``autocast``) against plain autograd through the full log-softmax:
    a head with a bias; bf16 weights and hidden states (bf16 matmuls, float32 softmax, bf16 gradients);
    float32 weights under bf16 CPU autocast, where backward recomputes the logits in bf16 as forward did.
    ``wrapped``: the checkpointed path with a bias."""
    g = torch.Generator().manual_seed(7)
    head = nn.Linear(H, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.5)
        head.bias.copy_(torch.randn(V, generator=g))
    hidden = torch.randn(N, H, generator=g)
    targets = torch.randint(0, V, (N,), generator=g)
    upstream = torch.randn(N, generator=g)
    if kind == "bf16":
        head.to(torch.bfloat16)
        hidden = hidden.bfloat16()
    hidden.requires_grad_(True)
    tol = 1e-6 if kind in ("bias", "wrapped") else 2e-2

    def run(fn):
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "autocast"):
            lp = fn()
        (lp * upstream).sum().backward()
        return lp.detach(), hidden.grad.float(), head.weight.grad.float(), head.bias.grad.float()

    want = run(lambda: _full(hidden, head, targets))
    got = run(lambda: selected_logprobs(hidden, _wrapped(head) if kind == "wrapped" else head, targets, 4))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=0)
    assert float(want[3].abs().sum()) > 0.5  # the bias gets a real gradient


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
def test_a_selected_forward_equals_the_log_softmax_of_the_logits(family):
    """``forward(select=...)`` returns ``log_softmax(logits)[r, c, target]`` at every selected (row, column),
    left padding included (Dream: a row's first real token reads its own raw column), with gradients equal to
    the full logits' ones; ``raw_columns`` names the column each token is read from."""
    cfg = tiny_config(family, vocab_size=48, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, block_size=4)
    model = build_model(family, cfg, seed=3)
    ids = torch.randint(0, 46, (3, 9), generator=torch.Generator().manual_seed(4))
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[1, :3] = False
    valid[2, :1] = False
    rows, cols = (t.reshape(-1) for t in torch.meshgrid(torch.arange(3), torch.arange(9), indexing="ij"))
    targets = torch.randint(0, 48, (27,), generator=torch.Generator().manual_seed(5))

    def grads(run):
        model.zero_grad(set_to_none=True)
        lp = run()
        lp.sum().backward()
        return lp.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    full = torch.log_softmax(model(ids, attention_mask=valid).logits.float(), -1)
    want, g_want = grads(lambda: torch.log_softmax(model(ids, attention_mask=valid).logits.float(), -1)[
        rows, cols, targets])
    out = model(ids, attention_mask=valid, select=Selection(rows, cols, targets, chunk_size=4))
    assert out.logits is None and out.last_raw_logits is None and out.logprobs.shape == (27,)
    got, g_got = grads(lambda: model(ids, attention_mask=valid, select=Selection(rows, cols, targets, 4)).logprobs)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, full[rows, cols, targets].detach(), atol=1e-6, rtol=0)
    assert g_got.keys() == g_want.keys() and "model.lm_head.weight" in g_got
    for k in g_want:  # chunked sums add in another order: float32 rounding (1.01e-6 seen on one CPU's kernels)
        torch.testing.assert_close(g_got[k], g_want[k], atol=1e-6, rtol=1e-5)
    raw = model.raw_columns(rows.view(3, 9), cols.view(3, 9), valid)
    if family == "dream":
        assert raw[1].tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 7]  # padding and the first real token (3) read their own
        assert model.raw_columns(rows.view(3, 9), cols.view(3, 9))[1].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    else:
        assert torch.equal(raw, cols.view(3, 9))
    with pytest.raises(ValueError, match="select projects its own columns; drop logits_to_keep"):
        model(ids, attention_mask=valid, select=Selection(rows, cols, targets, 4), logits_to_keep=2)


def test_the_head_selects_only_inside_the_block_and_its_hooks_run_once():
    """``head_selects``: the head's module hooks (where FSDP2 / ZeRO-3 gather its parameters) run once around
    the call, the chunks go through the head's own forward, and the head is a plain projection again after,
    also after an error; a forward set on the instance before is kept."""
    head, hidden, targets, _ = _inputs(2)
    calls = []
    head.register_forward_pre_hook(lambda m, args: calls.append(tuple(args[0].shape)))
    batch = hidden.detach().view(1, N, H)
    rows, cols = torch.zeros(N, dtype=torch.long), torch.arange(N).flip(0)
    with head_selects(head, rows, cols, targets.flip(0), 4):
        got = head(batch)
    assert calls == [(1, N, H)]
    torch.testing.assert_close(got, _full(hidden.detach(), head, targets).flip(0), atol=1e-6, rtol=0)
    assert head(batch).shape == (1, N, V) and "forward" not in head.__dict__
    with pytest.raises(IndexError):
        with head_selects(head, rows + 5, cols, targets, 4):
            head(batch)
    assert head(batch).shape == (1, N, V) and "forward" not in head.__dict__
    seen = []
    plain = head.forward

    def recording(x):
        seen.append(tuple(x.shape))
        return plain(x)

    head.forward = recording
    with head_selects(head, rows, cols, targets, 4):
        head(batch)
    assert seen == [(4, H), (4, H), (3, H)] and head.forward is recording
