"""Grouped-query attention reads each key/value head once (``dllm_rl.models.attention``): the query heads that share
a key head are stacked along the query axis instead of the keys being copied per query head. The results equal
transformers' SDPA path, which repeats them, bit for bit on CPU, forward and backward, in every family."""

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa

from dllm_rl.models import attention_bias, block_index, build_model, tiny_config
from dllm_rl.models.attention import GROUPED_SDPA, grouped_sdpa
from dllm_rl.models.families import FAMILIES


class Layer(torch.nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = False


def qkv(batch=3, heads=8, groups=4, q_len=5, k_len=11, dim=16, grad=False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, q_len, dim, generator=g, requires_grad=grad)
    k, v = (torch.randn(batch, heads // groups, k_len, dim, generator=g, requires_grad=grad) for _ in range(2))
    return q, k, v


def masks(batch=3, heads=8, q_len=5, k_len=11):
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(batch, 1, q_len, k_len, generator=g) > 0.4
    keep[..., 0] = True  # every query row sees a key
    per_head = torch.rand(batch, heads, q_len, k_len, generator=g) > 0.4
    per_head[..., 0] = True
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    return {"additive [B,1,L,K]": additive, "bool [B,1,L,K]": keep, "bool per head [B,H,L,K]": per_head,
            "additive, one row for the batch": additive[:1], "one row for every query [B,1,1,K]": additive[:, :, :1]}


@pytest.mark.parametrize("kind", list(masks()))
def test_stacked_query_heads_equal_repeated_keys(kind, monkeypatch):
    q, k, v = qkv()
    mask = masks()[kind]
    layer = Layer(groups=4)
    expected, _ = hf_sdpa.sdpa_attention_forward(layer, q, k, v, mask, scaling=0.25)
    calls = []
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: calls.append(n) or x)
    got, _ = grouped_sdpa(layer, q, k, v, mask, scaling=0.25)
    assert calls == []  # keys and values were not copied per query head
    assert got.shape == (3, 5, 8, 16)
    assert torch.equal(got, expected)


def test_gradients_equal_repeated_keys():
    layer, mask = Layer(groups=4), masks()["additive [B,1,L,K]"]
    grads = []
    for fn in (hf_sdpa.sdpa_attention_forward, grouped_sdpa):
        q, k, v = qkv(grad=True)
        out, _ = fn(layer, q, k, v, mask)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", ["no groups", "no mask", "one query", "long sequence"])
def test_other_calls_are_transformers_sdpa(case, monkeypatch):
    """Long sequence: 64 queries of a float32 mask per key column (256 bytes) are no fewer than the 2 key/value heads
    x 16 dims x (key + value) x 4 bytes that repeating copies per key column: stacking would copy more."""
    groups = 1 if case == "no groups" else 4
    q_len = {"one query": 1, "long sequence": 64}.get(case, 5)
    q, k, v = qkv(heads=8, groups=groups, q_len=q_len)
    mask = None if case == "no mask" else masks(q_len=q_len)["additive [B,1,L,K]"]
    seen = []
    real = hf_sdpa.sdpa_attention_forward
    monkeypatch.setattr("dllm_rl.models.attention.sdpa_attention_forward",
                        lambda *a, **kw: seen.append(1) or real(*a, **kw))
    got, _ = grouped_sdpa(Layer(groups), q, k, v, mask)
    assert seen == [1]
    if case == "long sequence":  # one query fewer and the mask is the smaller copy: stacked
        assert grouped_sdpa(Layer(groups), q[:, :, 1:], k, v, mask[:, :, 1:])[0].shape == (3, 63, 8, 16)
        assert seen == [1]
    assert torch.equal(got, real(Layer(groups), q, k, v, mask)[0])


# Masked-diffusion families only: DiffusionGemma (uniform noise) has no causal-LM forward to drive with a bias; its
# logits are checked against the stock model in test_models_diffusion_gemma.py.
MASKED = [name for name, fam in FAMILIES.items() if fam.noise == "mask"]


@pytest.mark.parametrize("family", MASKED)
def test_every_family_runs_grouped_and_matches_transformers_sdpa(family, monkeypatch):
    """A tiny model with 2 query heads per key head, under a block-causal bias with left padding: the logits equal
    the same model's under transformers' SDPA, and no key/value head is repeated."""
    model = build_model(family, tiny_config(family, num_heads=4, num_kv_heads=2, block_size=4), seed=0)
    hf = model.hf_model
    assert hf.config._attn_implementation == GROUPED_SDPA
    groups = {m.num_key_value_groups for m in hf.modules() if hasattr(m, "num_key_value_groups")}
    assert groups == {2}
    ids = torch.randint(3, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False
    pos = (valid.cumsum(-1) - 1).clamp(min=0)
    bias = attention_bias(valid, query_block=block_index(pos, 4),
                          key_block=block_index(pos, 4), dtype=model.dtype)
    calls = []
    real = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    ours = model(ids, attn_bias=bias, position_ids=pos).logits
    assert calls == []
    hf.set_attn_implementation("sdpa")
    theirs = model(ids, attn_bias=bias, position_ids=pos).logits
    assert calls, "transformers' SDPA repeats the grouped keys"
    assert torch.equal(ours[valid], theirs[valid])
