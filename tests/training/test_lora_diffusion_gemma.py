"""LoRA on DiffusionGemma: one adapter serves both text stacks (the encoder's layers are twins of the decoder's over
tied weights), the vision tower stays frozen, logits equal the merged model's, and the adapter and the merged
published layout round-trip."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from dllm_rl.models import build_model, load_model, save_model, tiny_config
from dllm_rl.training import LoraOptions, OptimConfig, apply_lora, build_optimizer, merged_model
from dllm_rl.training.lora import load_adapter_weights, load_named_adapters, merged_state_dict, save_adapter

ENC, DEC = "model.encoder.language_model.", "model.decoder."
CANVAS = 4
# adapted projections per stack: 7 in the sliding layer, 6 in the full one (Gemma-4's full layers have no v_proj)
PROJ = 7 + 6


def _model(tied=True):
    cfg = tiny_config("diffusion_gemma", vocab_size=64, hidden_size=16, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=CANVAS, tie_word_embeddings=tied)
    return build_model("diffusion_gemma", cfg, seed=0)


def _logits(dlm, self_conditioning=False):
    """The stock forward: the encoder over a prompt, the decoder over a canvas (with self-conditioning logits)."""
    g = torch.Generator().manual_seed(3)
    prompt, canvas = torch.randint(3, 60, (2, 5), generator=g), torch.randint(3, 60, (2, CANVAS), generator=g)
    extra = {"self_conditioning_logits": torch.randn(2, CANVAS, 64, generator=g)} if self_conditioning else {}
    return dlm.model(input_ids=prompt, decoder_input_ids=canvas, **extra).logits


def _adapted(dlm):
    from peft.tuners.lora import LoraLayer
    return [n for n, m in dlm.model.get_base_model().named_modules() if isinstance(m, LoraLayer)]


@pytest.fixture(scope="module")
def trained():
    dlm = apply_lora(_model(), LoraOptions(enabled=True, r=2, alpha=4), seed=0)
    base = {k: v.clone() for k, v in merged_state_dict(dlm).items()}
    opt = build_optimizer(dlm, OptimConfig(lr=1e-2))
    _logits(dlm, self_conditioning=True).logsumexp(-1).mean().backward()
    opt.step()
    opt.zero_grad()
    return dlm, base


def test_one_adapter_for_both_stacks_and_a_frozen_vision_tower(trained):
    dlm, _ = trained
    adapted = _adapted(dlm)
    encoder = [n for n in adapted if n.startswith(ENC)]
    assert len(encoder) == PROJ and not any(".vision_tower." in n for n in adapted)
    assert {n.removeprefix(DEC) for n in adapted if n.startswith(DEC + "layers.")} == \
        {n.removeprefix(ENC) for n in encoder}
    assert [n for n in adapted if n.startswith(DEC + "self_conditioning.")] == [
        f"{DEC}self_conditioning.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    base = dlm.model.get_base_model()
    for name in encoder:  # the twins hold the decoder's adapter tensors themselves
        twin = base.get_submodule(DEC + name.removeprefix(ENC))
        mine = base.get_submodule(name)
        assert mine.lora_A["default"].weight is twin.lora_A["default"].weight
        assert mine.lora_B["default"].weight is twin.lora_B["default"].weight
    trainable = {id(p): n for n, p in dlm.model.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * (PROJ + 3)  # A and B of the decoder's projections and self-conditioning, once each
    assert all(".lora_" in n and ".vision_tower." not in n for n in trainable.values())


def test_a_step_changes_the_encoder_and_decoder_weights_identically(trained):
    dlm, before = trained
    after = merged_state_dict(dlm)
    moved = [k for k in after if k.startswith(DEC + "layers.") and not torch.equal(after[k], before[k])]
    assert len(moved) == PROJ  # every adapted projection of both decoder layers
    for key in moved:
        twin = ENC + key.removeprefix(DEC)
        assert torch.equal(after[twin], after[key]) and not torch.equal(after[twin], before[twin])
    assert all(torch.equal(after[k], before[k]) for k in after if ".vision_tower." in k)


@pytest.mark.parametrize("self_conditioning", [False, True])
def test_logits_equal_the_merged_model(trained, self_conditioning):
    dlm, _ = trained
    with torch.no_grad():
        live = _logits(dlm, self_conditioning)
        merged = _logits(merged_model(dlm), self_conditioning)
        with dlm.model.disable_adapter():
            base = _logits(dlm, self_conditioning)
    torch.testing.assert_close(live, merged, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(live, base, atol=1e-4)


def test_adapter_and_merged_published_layout_round_trip(trained, tmp_path):
    dlm, _ = trained
    with torch.no_grad():
        live = _logits(dlm, True)
    save_adapter(dlm, tmp_path / "adapter")
    named = load_named_adapters(_model(), {"default": tmp_path / "adapter"})
    fresh = apply_lora(_model(), LoraOptions(enabled=True, r=2, alpha=4), seed=1)
    load_adapter_weights(fresh, tmp_path / "adapter")
    save_model(merged_model(dlm), tmp_path / "merged")
    save_model(_model(), tmp_path / "plain")
    with torch.no_grad():
        for other in (named, fresh, load_model(tmp_path / "merged")):
            torch.testing.assert_close(_logits(other, True), live, atol=1e-5, rtol=1e-5)
    with safe_open(str(tmp_path / "merged" / "model.safetensors"), "pt") as f, \
            safe_open(str(tmp_path / "plain" / "model.safetensors"), "pt") as g:
        assert set(f.keys()) == set(g.keys())  # the published names: no adapter, no encoder twin
    # a loaded adapter is tied again: its twins share one tensor
    layer = named.model.get_base_model().model
    assert layer.encoder.language_model.layers[0].self_attn.q_proj.lora_B["default"].weight is \
        layer.decoder.layers[0].self_attn.q_proj.lora_B["default"].weight


def test_untied_checkpoints_get_an_adapter_per_stack():
    dlm = apply_lora(_model(tied=False), LoraOptions(enabled=True, r=2, alpha=4), seed=0)
    base = dlm.model.get_base_model().model
    enc, dec = base.encoder.language_model.layers[0].self_attn.q_proj, base.decoder.layers[0].self_attn.q_proj
    assert enc.lora_A["default"].weight is not dec.lora_A["default"].weight
    assert len({id(p) for p in dlm.model.parameters() if p.requires_grad}) == 2 * (2 * PROJ + 3)
