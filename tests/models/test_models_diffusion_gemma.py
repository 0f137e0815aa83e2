"""DiffusionGemma (uniform-state diffusion) as a family: the published layout in and out, and logits equal to the
stock ``DiffusionGemmaForBlockDiffusion``'s through encoder cache, self-conditioning and padding."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache

from dllm_rl.models import tiny_config
from dllm_rl.models.families import FAMILIES, detect_family, resolve_mask_token_id
from dllm_rl.models.loading import build_model, load_model, save_model

CANVAS = 8


def tiny() -> dict:
    return tiny_config("diffusion_gemma", vocab_size=96, hidden_size=32, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, block_size=CANVAS)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A tiny checkpoint written by the stock class's own ``save_pretrained`` (the published layout)."""
    path = tmp_path_factory.mktemp("dgemma_pub")
    torch.manual_seed(0)
    stock = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(tiny())).eval()
    stock.save_pretrained(str(path))
    return path, stock


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_tiny_is_small_moe_with_a_sliding_and_a_full_layer_and_no_mask():
    cfg = tiny()
    text = cfg["text_config"]
    assert text["layer_types"] == ["sliding_attention", "full_attention"]
    assert (text["num_experts"], text["top_k_experts"], cfg["canvas_length"]) == (4, 2, CANVAS)
    assert cfg["tie_word_embeddings"] is True and "mask_token_id" not in cfg
    model = build_model("diffusion_gemma", cfg)
    assert sum(p.numel() for p in model.hf_model.parameters()) < 1_000_000
    fam = FAMILIES["diffusion_gemma"]
    assert (fam.noise, fam.mask_token_id, fam.moe) == ("uniform", None, True)
    assert (model.mask_token_id, model.block_size) == (None, CANVAS)
    assert detect_family(cfg) is fam
    assert resolve_mask_token_id({**cfg, "mask_token_id": 5}, fam, "config.json") is None
    with pytest.raises(TypeError, match="no mask token"):
        tiny_config("diffusion_gemma", mask_token_id=3)


def test_published_layout_round_trip_is_exact(published, tmp_path):
    """save_pretrained -> our loader -> our saver: the same tensor names and values and the same config.json."""
    path, _ = published
    pub_names = set(_tensors(path))
    assert "lm_head.weight" not in pub_names and "model.decoder.layers.0.self_attn.q_proj.weight" in pub_names
    assert "model.encoder.language_model.layers.0.self_attn.q_proj.weight" not in pub_names  # tied to the decoder
    assert "model.encoder.language_model.layers.0.layer_scalar" in pub_names  # a buffer: stored for both stacks
    model = load_model(path)
    hf = model.hf_model
    encoder, decoder = hf.model.encoder.language_model.layers[0], hf.model.decoder.layers[0]
    assert encoder.self_attn.q_proj.weight is decoder.self_attn.q_proj.weight
    assert hf.lm_head.weight is hf.model.decoder.embed_tokens.weight
    out = tmp_path / "out"
    save_model(model, out)
    ours, theirs = _tensors(out), _tensors(path)
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    assert json.loads((out / "config.json").read_text()) == json.loads((path / "config.json").read_text())


def _stock_logits(model, prompt, canvas, sc=None, mask=None, cache=None):
    cache = cache if cache is not None else DynamicCache(config=model.config.get_text_config(decoder=True))
    dec_mask = None if mask is None else torch.nn.functional.pad(mask, (0, canvas.shape[1]), value=True)
    out = model(input_ids=prompt, attention_mask=mask, cache=cache, decoder_input_ids=canvas,
                self_conditioning_logits=sc, decoder_attention_mask=dec_mask)
    return out.logits, cache


def test_loaded_logits_equal_the_stock_forward_with_and_without_self_conditioning(published):
    path, stock = published
    model = load_model(path).hf_model
    g = torch.Generator().manual_seed(1)
    prompt, canvas = torch.randint(3, 90, (2, 5), generator=g), torch.randint(0, 96, (2, CANVAS), generator=g)
    ours, _ = _stock_logits(model, prompt, canvas)
    theirs, _ = _stock_logits(stock, prompt, canvas)
    assert ours.shape == (2, CANVAS, 96) and torch.equal(ours, theirs)
    sc = torch.randn(2, CANVAS, 96, generator=g)
    with_sc, _ = _stock_logits(model, prompt, canvas, sc=sc)
    assert torch.equal(with_sc, _stock_logits(stock, prompt, canvas, sc=sc)[0])
    assert not torch.allclose(with_sc, ours)  # self-conditioning changes the logits


def test_encoder_cache_across_two_canvases_equals_one_encoding(published):
    """Encoding the prompt, then the first canvas into the cache, gives the second canvas the logits that encoding
    prompt + first canvas at once gives."""
    path, _ = published
    model = load_model(path).hf_model
    g = torch.Generator().manual_seed(2)
    prompt, first, second = (torch.randint(3, 90, (1, n), generator=g) for n in (5, CANVAS, CANVAS))
    _, cache = _stock_logits(model, prompt, first)
    model.model.encoder(input_ids=first, cache=cache, position_ids=torch.arange(5, 5 + CANVAS)[None])
    stepped = model(cache=cache, decoder_input_ids=second).logits
    whole, _ = _stock_logits(model, torch.cat([prompt, first], 1), second)
    torch.testing.assert_close(stepped, whole, atol=1e-5, rtol=0)


def test_batch_rows_do_not_depend_on_each_other(published):
    """Equal-length prompts: a row's logits in a batch of 3 equal its logits alone. (The stock model gives a padded
    batch one position range for every row, so a left-padded row is not the row alone; see the next test.)"""
    path, _ = published
    model = load_model(path).hf_model
    g = torch.Generator().manual_seed(3)
    prompt, canvas = torch.randint(3, 90, (3, 6), generator=g), torch.randint(0, 96, (3, CANVAS), generator=g)
    batch, _ = _stock_logits(model, prompt, canvas)
    for row in range(3):
        alone, _ = _stock_logits(model, prompt[row:row + 1], canvas[row:row + 1])
        torch.testing.assert_close(batch[row:row + 1], alone, atol=1e-5, rtol=0)


def test_padded_batch_matches_the_stock_model(published):
    """A left-padded batch: our loaded model's logits equal the stock model's under the same attention mask, and the
    padded positions are masked out (changing the pad ids changes nothing)."""
    path, stock = published
    model = load_model(path).hf_model
    g = torch.Generator().manual_seed(4)
    prompt, canvas = torch.randint(3, 90, (2, 6), generator=g), torch.randint(0, 96, (2, CANVAS), generator=g)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    ours, _ = _stock_logits(model, prompt, canvas, mask=mask)
    assert torch.equal(ours, _stock_logits(stock, prompt, canvas, mask=mask)[0])
    other = prompt.clone()
    other[1, :2] = 0
    torch.testing.assert_close(_stock_logits(model, other, canvas, mask=mask)[0], ours, atol=1e-5, rtol=0)


def test_a_list_of_eos_ids_loads_saves_back_and_decodes(tmp_path):
    """Gemma's configs give ``eos_token_id`` as a list (end of sequence, end of turn): a published checkpoint with
    ``text_config.eos_token_id: [1, 5]`` loads with every id (the first is ``eos_token_id``), the ids of its
    generation_config.json (which the stock ``from_pretrained`` loads for ``generate``) are added, our saver writes
    both files back as they were, and the model decodes. (Before, ``int([1, 5])`` raised a TypeError at load.)"""
    from dllm_rl.sampling import DecodeConfig, generate

    cfg = tiny()
    cfg["text_config"]["eos_token_id"] = [1, 5]
    path = tmp_path / "pub"
    torch.manual_seed(0)
    DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(cfg)).save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7], "pad_token_id": 0}))
    assert DiffusionGemmaForBlockDiffusion.from_pretrained(str(path)).generation_config.eos_token_id == [1, 7]
    model = load_model(path)
    assert (model.eos_token_ids, model.eos_token_id, model.pad_token_id) == ((1, 5, 7), 1, 0)
    out = tmp_path / "out"
    save_model(model, out)
    assert json.loads((out / "config.json").read_text()) == json.loads((path / "config.json").read_text())
    assert json.loads((out / "config.json").read_text())["text_config"]["eos_token_id"] == [1, 5]
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": [1, 7], "pad_token_id": 0}
    again = load_model(out)
    assert again.eos_token_ids == (1, 5, 7)
    roll = generate(again, [[4, 5, 6]], DecodeConfig(gen_length=CANVAS, max_denoising_steps=2, seed=0))
    assert roll.completion_ids.shape == (1, CANVAS) and int(roll.nfe[0]) == 2
