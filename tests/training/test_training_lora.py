"""LoRA through peft: only adapters train, merged == unmerged logits, published save and exact reload."""

from __future__ import annotations

import pytest
import torch

from dllm_rl.models import build_model, load_model, tiny_config
from dllm_rl.training import (
    LoraOptions,
    OptimConfig,
    apply_lora,
    build_optimizer,
    has_lora,
    load_checkpoint,
    merged_model,
    save_checkpoint,
)


def _model(family="llada"):
    return build_model(family, tiny_config(family, vocab_size=32, hidden_size=32, intermediate_size=64), seed=0)


def _train(dlm, steps=3, lr=1e-2):
    opt = build_optimizer(dlm, OptimConfig(lr=lr))
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    for _ in range(steps):
        loss = dlm(ids).logits.float().logsumexp(-1).mean() - dlm(ids).logits[..., 3].float().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_only_adapters_change_and_merged_logits_match(family):
    dlm = _model(family)
    before = {k: v.clone() for k, v in dlm.model.state_dict().items()}
    apply_lora(dlm, LoraOptions(enabled=True, r=4, alpha=8))
    assert has_lora(dlm)
    trainable = {n for n, p in dlm.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert targets == set(dlm.family.lora_target_modules)
    _train(dlm)
    after = dlm.model.get_base_model().state_dict()
    changed = [k for k, v in after.items() if k.endswith("lora_B.default.weight") and v.abs().sum() > 0]
    assert changed  # B starts at zero; training moved it
    for k, v in before.items():  # every base weight is bit-identical
        key = k if k in after else k.replace(".weight", ".base_layer.weight")
        assert torch.equal(after[key], v), k
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        live = dlm(ids).logits
        merged = merged_model(dlm)(ids).logits
        with dlm.model.disable_adapter():
            base = dlm(ids).logits
    assert not has_lora(merged_model(dlm))
    assert torch.allclose(live, merged, atol=1e-5)
    assert not torch.allclose(live, base, atol=1e-3)  # the adapters do something


def test_lora_target_modules_checked():
    with pytest.raises(ValueError, match="not modules"):
        apply_lora(_model(), LoraOptions(enabled=True, target_modules=["qkv_proj"]))


def test_lora_checkpoint_published_layout_and_resume(tmp_path):
    dlm = apply_lora(_model(), LoraOptions(enabled=True, r=4, alpha=8))
    opt = _train(dlm)
    ckpt = save_checkpoint(tmp_path / "ck", dlm, optimizer=opt, step=3)
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file()
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        want = dlm(ids).logits
        published = load_model(ckpt / "model")  # merged, published llada names
        assert torch.allclose(published(ids).logits, want, atol=1e-5)
    fresh = apply_lora(_model(), LoraOptions(enabled=True, r=4, alpha=8))
    opt2 = build_optimizer(fresh, OptimConfig(lr=1e-2))
    state = load_checkpoint(ckpt, fresh, optimizer=opt2)
    assert state.step == 3
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, want)
    with pytest.raises(ValueError, match="LoRA"):
        load_checkpoint(ckpt, _model())


def _adapted(dlm):
    return sorted({n.split(".lora_A")[0] for n, _ in dlm.model.get_base_model().named_parameters() if ".lora_A." in n})


_PROJECTIONS = ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj",
                "self_attn.q_proj", "self_attn.v_proj"]


@pytest.mark.parametrize(("family", "layers"), [("llada_v", "model.language_model.layers"), ("mmada", "model.layers")])
def test_multimodal_lora_adapts_the_language_model_only(family, layers):
    dlm = apply_lora(_model(family), LoraOptions(enabled=True, r=4, alpha=8))
    assert _adapted(dlm) == [f"{layers}.{i}.{p}" for i in (0, 1) for p in _PROJECTIONS]
    trainable = [n for n, p in dlm.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * 2 * 7 and all(".lora_" in n for n in trainable)
    # the (MMaDA: code-extended) embedding stays frozen under LoRA, as in the text families
    base = dlm.model.get_base_model()
    assert not base.get_input_embeddings().weight.requires_grad


def test_llada_v_lora_adapts_the_tower_or_projector_only_when_named():
    dlm = apply_lora(_model("llada_v"), LoraOptions(enabled=True, r=4, alpha=8, target_modules=["q_proj", "linear_1"]))
    assert _adapted(dlm) == ["model.language_model.layers.0.self_attn.q_proj",
                             "model.language_model.layers.1.self_attn.q_proj", "model.multi_modal_projector.linear_1"]


def test_llada_v_lora_trains_and_merges_into_the_image_text_model(tmp_path):
    dlm = apply_lora(_model("llada_v"), LoraOptions(enabled=True, r=4, alpha=8))
    tower = {k: v.clone() for k, v in dlm.model.get_base_model().model.vision_tower.state_dict().items()}
    opt = _train(dlm)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        live = dlm(ids).logits
        merged = merged_model(dlm)
        with dlm.model.disable_adapter():
            base = dlm(ids).logits
    assert type(merged.model).__name__ == "LlavaOnevisionForConditionalGeneration"
    assert torch.allclose(merged(ids).logits, live, atol=1e-5) and not torch.allclose(live, base, atol=1e-3)
    for k, v in merged.model.model.vision_tower.state_dict().items():
        assert torch.equal(v, tower[k]), k
    ckpt = save_checkpoint(tmp_path / "ck", dlm, optimizer=opt, step=3)
    with torch.no_grad():
        assert torch.allclose(load_model(ckpt / "model")(ids).logits, live, atol=1e-5)
