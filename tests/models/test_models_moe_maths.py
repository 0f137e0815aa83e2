"""Hand-written published-layout MoE checkpoints compute the published equations, written out here."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dllm_rl.models import load_model, tiny_config

H, NH, NKV, HD, V, E, I_MOE, I_DENSE = 16, 2, 1, 8, 32, 4, 8, 24


def _rms(h, w, eps=1e-6):
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def _rope(u, pos, rot_dim, theta):
    """RoPE (rotate_half) on the first rot_dim dims of each head."""
    inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    ang = torch.outer(pos.float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    r, rest = u[..., :rot_dim], u[..., rot_dim:]
    r1, r2 = r[..., : rot_dim // 2], r[..., rot_dim // 2:]
    return torch.cat([r * cos + torch.cat([-r2, r1], -1) * sin, rest], -1)


def _attention(h, q_w, k_w, v_w, o_w, qn, kn, allowed, rot_dim, theta):
    T = h.shape[0]
    q = (h @ q_w.T).view(T, NH, HD)
    k = (h @ k_w.T).view(T, NKV, HD)
    v = (h @ v_w.T).view(T, NKV, HD)
    q, k = _rms(q, qn), _rms(k, kn)  # per-head q/k norm, before RoPE
    pos = torch.arange(T)
    q, k = _rope(q.transpose(0, 1), pos, rot_dim, theta), _rope(k.transpose(0, 1), pos, rot_dim, theta)
    k, v = k.repeat_interleave(NH // NKV, 0), v.transpose(0, 1).repeat_interleave(NH // NKV, 0)
    scores = (q @ k.transpose(-1, -2)) / HD**0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, NH * HD) @ o_w.T


def _mlp(x, g, u, d):
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T


def _experts(x, chosen, weights, t, p):
    out = torch.zeros_like(x)
    for tok in range(x.shape[0]):
        for slot in range(chosen.shape[1]):
            j = int(chosen[tok, slot])
            e = f"{p}mlp.experts.{j}."
            out[tok] += weights[tok, slot] * _mlp(x[tok], t[e + "gate_proj.weight"], t[e + "up_proj.weight"],
                                                  t[e + "down_proj.weight"])
    return out


def _llada2_route(x, w, bias, n_group, topk_group, top_k, scale):
    """Sigmoid scores; bias for the choice only; groups by the sum of their top-2; renormalised; scaled."""
    scores = torch.sigmoid(x @ w.T)
    choice = scores + bias
    groups = choice.view(-1, n_group, E // n_group).topk(2, -1).values.sum(-1)
    keep = torch.zeros_like(groups).scatter(1, groups.topk(topk_group, -1).indices, 1.0)
    choice = choice.masked_fill(keep.repeat_interleave(E // n_group, 1) == 0, float("-inf"))
    chosen = choice.topk(top_k, -1).indices
    weights = scores.gather(1, chosen)
    return chosen, weights / weights.sum(-1, keepdim=True) * scale


def _randn(*shape):
    return torch.randn(*shape) * 0.3


def test_llada2_logits_equal_the_published_equations(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config("llada2", vocab_size=V, hidden_size=H, num_layers=2, num_heads=NH, num_kv_heads=NKV,
                      intermediate_size=I_DENSE, moe_intermediate_size=I_MOE, block_size=4)
    t = {"model.word_embeddings.weight": _randn(V, H), "model.norm.weight": torch.rand(H) + 0.5,
         "lm_head.weight": _randn(V, H)}
    for i in range(2):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": torch.rand(H) + 0.5,
              p + "post_attention_layernorm.weight": torch.rand(H) + 0.5,
              p + "attention.query_key_value.weight": _randn((NH + 2 * NKV) * HD, H),
              p + "attention.dense.weight": _randn(H, NH * HD),
              p + "attention.query_layernorm.weight": torch.rand(HD) + 0.5,
              p + "attention.key_layernorm.weight": torch.rand(HD) + 0.5}
        if i == 0:
            t |= {p + f"mlp.{m}_proj.weight": _randn(*s) for m, s in
                  (("gate", (I_DENSE, H)), ("up", (I_DENSE, H)), ("down", (H, I_DENSE)))}
        else:
            t |= {p + "mlp.gate.weight": torch.randn(E, H),
                  p + "mlp.gate.expert_bias": torch.tensor([0.0, 0.6, -0.6, 0.3])}
            for pre, n in [(p + "mlp.shared_experts.", I_MOE)] + [(p + f"mlp.experts.{j}.", I_MOE) for j in range(E)]:
                t |= {pre + "gate_proj.weight": _randn(n, H), pre + "up_proj.weight": _randn(n, H),
                      pre + "down_proj.weight": _randn(H, n)}
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path)
    x = torch.tensor([3, 7, 1, 30, 5, 9, 2])
    T = len(x)
    blk = torch.arange(T) // 4
    allowed = blk[None, :] <= blk[:, None]  # block-causal, block 4
    h = t["model.word_embeddings.weight"][x]
    for i in range(2):
        p = f"model.layers.{i}."
        a = _rms(h, t[p + "input_layernorm.weight"])
        q_w, k_w, v_w = t[p + "attention.query_key_value.weight"].split([NH * HD, NKV * HD, NKV * HD])
        h = h + _attention(a, q_w, k_w, v_w, t[p + "attention.dense.weight"],
                           t[p + "attention.query_layernorm.weight"], t[p + "attention.key_layernorm.weight"],
                           allowed, HD // 2, cfg["rope_theta"])
        m = _rms(h, t[p + "post_attention_layernorm.weight"])
        if i == 0:
            h = h + _mlp(m, t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"], t[p + "mlp.down_proj.weight"])
            continue
        chosen, weights = _llada2_route(m, t[p + "mlp.gate.weight"], t[p + "mlp.gate.expert_bias"], 2, 1, 2, 2.5)
        unbiased, _ = _llada2_route(m, t[p + "mlp.gate.weight"], torch.zeros(E), 2, 1, 2, 2.5)
        shared = p + "mlp.shared_experts."
        h = h + _experts(m, chosen, weights, t, p) + _mlp(m, t[shared + "gate_proj.weight"],
                                                          t[shared + "up_proj.weight"], t[shared + "down_proj.weight"])
    ref = _rms(h, t["model.norm.weight"]) @ t["lm_head.weight"].T
    torch.testing.assert_close(model(x[None]).logits[0], ref, atol=1e-5, rtol=1e-5)
    # the expert bias changed some token's choice, so a loader that dropped it would fail the comparison
    assert not torch.equal(chosen.sort(-1).values, unbiased.sort(-1).values)


@pytest.mark.parametrize("family", ["sdar_moe", "llada_moe"])
def test_qwen3_moe_families_compute_softmax_top_k_routing(tmp_path, family):
    torch.manual_seed(1)
    cfg = tiny_config(family, vocab_size=V, hidden_size=H, num_layers=1, num_heads=NH, num_kv_heads=NKV,
                      intermediate_size=I_DENSE, moe_intermediate_size=I_MOE, block_size=4)
    if family == "sdar_moe":
        cfg["head_dim"] = HD
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": _randn(V, H), "model.norm.weight": torch.rand(H) + 0.5,
         "lm_head.weight": _randn(V, H), p + "input_layernorm.weight": torch.rand(H) + 0.5,
         p + "post_attention_layernorm.weight": torch.rand(H) + 0.5, p + "self_attn.q_proj.weight": _randn(NH * HD, H),
         p + "self_attn.k_proj.weight": _randn(NKV * HD, H), p + "self_attn.v_proj.weight": _randn(NKV * HD, H),
         p + "self_attn.o_proj.weight": _randn(H, NH * HD), p + "self_attn.q_norm.weight": torch.rand(HD) + 0.5,
         p + "self_attn.k_norm.weight": torch.rand(HD) + 0.5, p + "mlp.gate.weight": torch.randn(E, H)}
    for j in range(E):
        e = p + f"mlp.experts.{j}."
        t |= {e + "gate_proj.weight": _randn(I_MOE, H), e + "up_proj.weight": _randn(I_MOE, H),
              e + "down_proj.weight": _randn(H, I_MOE)}
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path)
    x = torch.tensor([4, 8, 15, 16, 23, 2])
    T = len(x)
    blk = torch.arange(T) // 4
    allowed = blk[None, :] <= blk[:, None] if family == "sdar_moe" else torch.ones(T, T, dtype=torch.bool)
    h = t["model.embed_tokens.weight"][x]
    a = _rms(h, t[p + "input_layernorm.weight"])
    h = h + _attention(a, t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"],
                       t[p + "self_attn.v_proj.weight"], t[p + "self_attn.o_proj.weight"],
                       t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"], allowed, HD,
                       cfg["rope_theta"])
    m = _rms(h, t[p + "post_attention_layernorm.weight"])
    probs = torch.softmax(m @ t[p + "mlp.gate.weight"].T, -1)
    weights, chosen = probs.topk(2, -1)
    if family == "sdar_moe":  # norm_topk_prob true in its config; LLaDA-MoE never renormalises
        weights = weights / weights.sum(-1, keepdim=True)
    h = h + _experts(m, chosen, weights, t, p)
    ref = _rms(h, t["model.norm.weight"]) @ t["lm_head.weight"].T
    torch.testing.assert_close(model(x[None]).logits[0], ref, atol=1e-5, rtol=1e-5)


def test_router_stats_of_an_moe_family_model_without_moe_layers():
    """A 1-layer LLaDA2 (its first layer is dense) has no router: no statistics, not a crash; with 2 layers the
    second routes every real token over all 4 experts."""
    from dllm_rl.models import build_model
    from dllm_rl.models.moe import router_stats

    ids = torch.randint(0, 16, (2, 5))
    valid = torch.ones(2, 5, dtype=torch.bool)
    for layers, want in ((1, set()), (2, {"moe_load_max", "moe_load_min", "moe_router_entropy",
                                          "moe_router_entropy_max"})):
        cfg = tiny_config("llada2", vocab_size=16, hidden_size=16, num_layers=layers, num_heads=2, num_kv_heads=1)
        stats = router_stats(build_model("llada2", cfg, seed=0), ids, valid)
        assert set(stats) == want
