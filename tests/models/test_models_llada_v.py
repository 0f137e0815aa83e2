"""LLaDA-V (``llada_v``): the published layout, the image path and the forward with an image, checked against
outputs of the published reference code on a tiny checkpoint (``fixtures/llada_v``, see its README)."""

import json
import shutil

import pytest
import torch
from llada_v_images import LLADA_V, pattern
from safetensors import safe_open
from safetensors.torch import load_file

from dllm_rl.errors import UserError
from dllm_rl.models import load_model, save_model
from dllm_rl.models.diffusion_lm import EmbedSplice, Selection
from dllm_rl.models.families import FAMILIES, detect_family
from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, image_prompts, preprocess

FIXTURES = LLADA_V
PROMPT = [5, 6, IMAGE_TOKEN_INDEX, 7, 8, 9]
GEN = 4
# case: (image_aspect_ratio, width, height, seed); tiles: 1 (pad), 3 (2x1 grid), 7 (3x2 grid, resized: 6 > 4 tiles)
CASES = {"pad": ("pad", 90, 50, 1), "anyres": ("anyres_max_4", 500, 260, 2),
         "anyres_big": ("anyres_max_4", 1000, 700, 3)}


@pytest.fixture(scope="module")
def reference():
    return load_file(str(FIXTURES / "reference.safetensors"))


@pytest.fixture(scope="module")
def dlm():
    return load_model(FIXTURES)


def _with_ratio(dlm, ratio):
    dlm.published_config["image_aspect_ratio"] = ratio
    return dlm


def _canvas(dlm, prompts, images, gen=GEN):
    """[spliced prompt | gen mask tokens], as the published sampler lays it out."""
    ip = image_prompts(dlm, prompts, images)
    b = ip.input_ids.shape[0]
    ids = torch.cat([ip.input_ids, torch.full((b, gen), dlm.mask_token_id)], 1)
    valid = torch.cat([ip.valid, torch.ones(b, gen, dtype=torch.bool)], 1)
    where = torch.cat([ip.splice.where, torch.zeros(b, gen, dtype=torch.bool)], 1)
    return ip, ids, valid, EmbedSplice(where, ip.splice.vectors)


@pytest.mark.parametrize("case", list(CASES))
def test_pixels_equal_the_published_processor(reference, dlm, case):
    ratio, w, h, seed = CASES[case]
    pixels, sizes = preprocess([pattern(w, h, seed)], _with_ratio(dlm, ratio).published_config)
    px = pixels[0].double()
    assert sizes == [(h, w)]
    assert px.shape == (reference[f"{case}.pixel_sub"].shape[0], 3, 384, 384)
    torch.testing.assert_close(px.sum(-1).float(), reference[f"{case}.pixel_rowsum"], atol=1e-4, rtol=0)
    torch.testing.assert_close(px.sum(-2).float(), reference[f"{case}.pixel_colsum"], atol=1e-4, rtol=0)
    torch.testing.assert_close(px[..., ::24, ::24].float(), reference[f"{case}.pixel_sub"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_with_an_image_equal_the_published_model(reference, dlm, case):
    ratio, w, h, seed = CASES[case]
    ip, ids, valid, splice = _canvas(_with_ratio(dlm, ratio), [PROMPT], [[pattern(w, h, seed)]])
    assert ip.input_ids.shape[1] == int(reference[f"{case}.prompt_length"])
    # 729 base-tile patches (+ the unpadded grid with a newline per row for anyres; + one newline for pad)
    assert int(ip.image.sum()) == ip.input_ids.shape[1] - 5
    with torch.no_grad():
        logits = dlm(ids, attention_mask=valid, splice=splice).logits[0]
    rows = reference[f"{case}.rows"]
    torch.testing.assert_close(logits[rows], reference[f"{case}.logits_rows"], atol=1e-4, rtol=0)
    torch.testing.assert_close(logits.double().mean(-1), reference[f"{case}.logits_mean"], atol=1e-5, rtol=0)


def test_pad_image_is_729_patches_and_one_newline(dlm):
    ip = image_prompts(_with_ratio(dlm, "pad"), [PROMPT], [[pattern(90, 50, 1)]])
    assert ip.image[0].tolist() == [False, False] + [True] * 730 + [False] * 3
    assert ip.input_ids[0, :2].tolist() == [5, 6] and ip.input_ids[0, -3:].tolist() == [7, 8, 9]
    newline = dlm.causal_lm.model.image_newline
    torch.testing.assert_close(ip.splice.vectors[-1], newline.detach(), atol=0, rtol=0)


def test_batch_left_pads_and_each_row_equals_its_own_forward(dlm):
    """Two prompts of different lengths and image counts in one batch: left padding, hidden pads, and each
    row's logits (and selected log-probs through the same splice) equal the row run alone."""
    _with_ratio(dlm, "pad")
    a, b = pattern(90, 50, 1), pattern(40, 70, 4)
    prompts = [[5, IMAGE_TOKEN_INDEX, 7], [IMAGE_TOKEN_INDEX, 8, IMAGE_TOKEN_INDEX, 9, 10]]
    ip, ids, valid, splice = _canvas(dlm, prompts, [[a], [b, a]])
    assert ip.valid.sum(1).tolist() == [2 + 730, 3 + 2 * 730] and not ip.valid[0, :730].any()
    with torch.no_grad():
        both = dlm(ids, attention_mask=valid, splice=splice).logits
        for i, (p, imgs) in enumerate(zip(prompts, [[a], [b, a]])):
            _, ids1, valid1, splice1 = _canvas(dlm, [p], [imgs])
            alone = dlm(ids1, attention_mask=valid1, splice=splice1).logits[0]
            torch.testing.assert_close(both[i, -alone.shape[0]:], alone, atol=1e-5, rtol=0)
        cols = torch.tensor([ids.shape[1] - 3, ids.shape[1] - 1])
        rows, targets = torch.tensor([1, 1]), torch.tensor([3, 11])
        sel = dlm(ids, attention_mask=valid, splice=splice, select=Selection(rows, cols, targets, chunk_size=1))
    torch.testing.assert_close(sel.logprobs, both.float().log_softmax(-1)[rows, cols, targets], atol=1e-5, rtol=0)


def test_placeholder_count_that_does_not_match_the_images_is_a_one_line_user_error(dlm):
    img = pattern(90, 50, 1)
    with pytest.raises(UserError) as exc:
        image_prompts(dlm, [[5, 6, 7], [IMAGE_TOKEN_INDEX, 5, IMAGE_TOKEN_INDEX]], [[], [img]])
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("prompt 1 has 2 image placeholder(s) (-200, '<image>') but 1 image(s) were given")
    with pytest.raises(UserError, match="2 prompts but 1 image lists"):
        image_prompts(dlm, [[5], [6]], [[]])


def test_save_load_round_trip_keeps_the_published_names_and_config(dlm, tmp_path):
    src = json.loads((FIXTURES / "config.json").read_text())
    loaded = load_model(FIXTURES)
    save_model(loaded, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == src
    theirs, ours = load_file(str(FIXTURES / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    # the published layout: shortened tower (2 of 3 layers), post_layernorm kept, no pooling head
    assert {n for n in names if ".encoder.layers." in n and n.endswith("layer_norm1.weight")} == {
        f"model.vision_tower.vision_tower.vision_model.encoder.layers.{i}.layer_norm1.weight" for i in (0, 1)}
    assert "model.vision_tower.vision_tower.vision_model.post_layernorm.weight" in names
    assert not any(".head." in n for n in names)
    assert {"model.mm_projector.0.weight", "model.mm_projector.2.bias", "model.image_newline", "lm_head.weight",
            "model.layers.1.self_attn.o_proj.weight", "model.embed_tokens.weight"} <= names
    ids = torch.tensor([[5, 6, 7, 63]])
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path)(ids).logits, loaded(ids).logits, atol=0, rtol=0)


def test_family_facts_and_refusals(tmp_path):
    src = json.loads((FIXTURES / "config.json").read_text())
    fam = detect_family(src)
    assert fam is FAMILIES["llada_v"] and detect_family({"model_type": "llava_llada"}) is fam
    hf = fam.hf_config(src)
    assert hf.vision_config.num_hidden_layers == 2 and not hf.vision_config.vision_use_head
    assert hf.get_text_config().head_dim == 8 and hf.vision_feature_layer == -1
    assert hf.image_grid_pinpoints[:3] == [[384, 384], [768, 384], [1152, 384]]  # [h, w] of published (w, h)
    assert len(hf.image_grid_pinpoints) == 36
    for key, value in [("mm_projector_type", "linear"), ("mm_patch_merge_type", "flat"),
                       ("image_aspect_ratio", "square"), ("rope_scaling", {"type": "linear", "factor": 2.0})]:
        with pytest.raises(UserError, match=f"llada_v config.json: {key}="):
            fam.hf_config({**src, key: value})
    with pytest.raises(UserError, match="mm_hidden_size=8 differs from the vision tower's hidden_size 16"):
        fam.hf_config({**src, "mm_hidden_size": 8})
    shutil.copy(FIXTURES / "model.safetensors", tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({**src, "num_hidden_layers": 3}))
    with pytest.raises(UserError, match="lacks tensors"):
        load_model(tmp_path)
