"""DiffusionGemma's routers (the stock ``DiffusionGemmaTextRouter``, which returns softmax probabilities): found in
both stacks, frozen together, their statistics read on the encoder and checked by hand, and the active parameter
count with the tied twins counted once."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.models.moe import freeze_routers, moe_summary, router_stats, routers

H, E, K, MI = 32, 4, 2, 16


@pytest.fixture(scope="module")
def dlm():
    cfg = tiny_config("diffusion_gemma", vocab_size=96, hidden_size=H, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=8)
    model = build_model("diffusion_gemma", cfg, seed=0)
    with torch.no_grad():  # sharp routing, so that a second softmax over the probabilities would show
        for layer in model.hf_model.model.decoder.layers:
            layer.router.proj.weight.mul_(1000)
    return model


def test_routers_come_in_tied_pairs(dlm):
    found = routers(dlm.hf_model)
    enc = dlm.hf_model.model.encoder.language_model.layers
    dec = dlm.hf_model.model.decoder.layers
    assert found == [*(layer.router for layer in enc), *(layer.router for layer in dec)]
    assert all(e.router.proj.weight is d.router.proj.weight for e, d in zip(enc, dec, strict=True))


def test_router_stats_are_the_encoder_routing_of_the_real_tokens_by_hand(dlm):
    ids = torch.randint(3, 90, (2, 6), generator=torch.Generator().manual_seed(1))
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[0, :2] = False  # left padding: left out of the statistics
    inputs = []
    layers = dlm.hf_model.model.encoder.language_model.layers
    handles = [layer.router.register_forward_hook(lambda m, a, o: inputs.append((m, a[0].detach())))
               for layer in layers]
    try:
        stats = router_stats(dlm, ids, valid)
    finally:
        for h in handles:
            h.remove()
    assert [m for m, _ in inputs] == [layer.router for layer in layers]  # the encoder only, once per layer
    loads, entropies = [], []
    for router, x in inputs:
        x = x[valid.reshape(-1)]
        with torch.no_grad():
            probs = torch.softmax(router.proj(router.norm(x) * router.scale * H ** -0.5).float(), -1)
        chosen = probs.topk(K, -1).indices
        loads.append(torch.bincount(chosen.reshape(-1), minlength=E).float() / chosen.numel() * E)
        entropies.append(-(probs * probs.log()).sum(-1).mean())
    load = torch.stack(loads).mean(0)
    assert stats["moe_load_max"] == pytest.approx(float(load.max()), abs=1e-6)
    assert stats["moe_load_min"] == pytest.approx(float(load.min()), abs=1e-6)
    assert stats["moe_router_entropy"] == pytest.approx(float(torch.stack(entropies).mean()), abs=1e-5)
    assert stats["moe_router_entropy"] < 0.9 * math.log(E)  # sharp: not the near-uniform softmax of probabilities
    assert stats["moe_router_entropy_max"] == pytest.approx(math.log(E))


def test_freeze_routers_freezes_both_stacks_and_nothing_else():
    cfg = tiny_config("diffusion_gemma", vocab_size=96, hidden_size=H, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=8)
    model = build_model("diffusion_gemma", cfg, seed=0)
    assert freeze_routers(model.hf_model) == 4  # 2 layers x (encoder, decoder)
    frozen = {n for n, p in model.hf_model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert frozen and all(".router." in n for n in frozen)
    assert {n.rsplit(".router.", 1)[1] for n in frozen} == {"proj.weight", "scale", "per_expert_scale"}
    assert any(n.startswith("model.encoder.") for n in frozen) and any(n.startswith("model.decoder.") for n in frozen)


def test_active_parameters_count_the_tied_experts_once(dlm):
    routed = 2 * E * (2 * MI * H + H * MI)  # 2 layers of E experts (gate_up and down), shared by both stacks
    total = dlm.num_parameters()
    assert moe_summary(dlm) == {"experts": E, "experts_per_token": K,
                                "active_parameters": total - routed + routed * K // E}
