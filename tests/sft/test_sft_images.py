"""SFT on image-text pairs: rows carry an image (path, data URI, bytes, PIL, a ``datasets`` Image value), tiny
LLaDA-V and MMaDA models train on them (loss falling on a fixed pair), and the image positions are never masked
or scored."""

from __future__ import annotations

import base64
import io
import json
import math

import pytest
import torch
from image_fixture import LLADA_V_IMAGE_POSITIONS, MMADA_CODES, write_image_checkpoints
from PIL import Image

from dllm_rl.config import load_config
from dllm_rl.errors import UserError
from dllm_rl.estimators import plan_rows
from dllm_rl.models import char_tokenizer
from dllm_rl.models.families.mmada import EOI_ID, MMU_ID, SOI_ID
from dllm_rl.sft.config import SFTConfig
from dllm_rl.sft.data import DataConfig, collate, encode_images, encode_row
from dllm_rl.sft.objectives import compute_objective
from dllm_rl.sft.trainer import SFTTrainer
from dllm_rl.tasks.shapes import draw_scene

SCENE = [{"shape": "circle", "colour": "red", "row": 0, "col": 1}, {"shape": "square", "colour": "blue", "row": 2,
                                                                     "col": 2}]


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def sft_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_images")
    write_image_checkpoints(root, char_tokenizer())
    (root / "pics").mkdir()
    draw_scene(SCENE, 32).save(root / "pics" / "scene.png")
    uri = "data:image/png;base64," + base64.b64encode(_png(draw_scene(SCENE[:1], 32))).decode()
    rows = [{"image": "pics/scene.png", "prompt": "count red circle\n", "response": "<answer>1</answer>"},
            {"image": uri, "prompt": "colour circle\n", "response": "<answer>red</answer>"},
            {"image": "pics/missing.png", "prompt": "count red circle\n", "response": "<answer>1</answer>"}]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _cfg(root, family, out, *extra):
    return load_config(SFTConfig, None, [
        f"model.path={root / family}", f"data.train_file={root / 'pairs.jsonl'}", "data.chat_template=never",
        "train.micro_batch_size=2", "train.max_steps=30", "run.progress=false", f"run.output_dir={out}",
        "train.log_every=1", "optim.lr=3e-2", "optim.warmup_steps=1", "run.seed=0", *extra])


def _fixed_loss(trainer, draws=4):
    """The objective on both pairs (images encoded), averaged over ``draws`` fixed mask draws."""
    mine, images = encode_images(trainer.examples, trainer.prompts, trainer.dlm)
    batch = collate(mine, trainer.dlm.pad_token_id, images)
    with torch.no_grad():
        return sum(compute_objective("random_mask", trainer.dlm, batch, torch.Generator().manual_seed(seed)).loss.item()
                   for seed in range(draws)) / draws


def test_image_values_of_every_kind_become_the_same_rgb_image():
    """A path, a data URI, bytes, a PIL image and a ``datasets`` Image value ({bytes, path}) give the same pixels;
    the prompt gets its ``<image>`` line and its tokens are the text's only."""
    tok = char_tokenizer()
    img = draw_scene(SCENE, 32)
    png = _png(img)
    cfg = DataConfig(chat_template="never")
    values = [png, img, {"bytes": png, "path": None},
              "data:image/png;base64," + base64.b64encode(png).decode()]
    for value in values:
        ex = encode_row({"image": value, "prompt": "count red circle\n", "response": "1"}, cfg, tok, 1, where="row")
        assert ex.prompt_text == "<image>\ncount red circle\n" and len(ex.images) == 1
        assert ex.images[0].tobytes() == img.tobytes()
        assert ex.prompt_ids == tok.encode("\ncount red circle\n", add_special_tokens=False)
    text = encode_row({"prompt": "a <image> b", "response": "1"}, cfg, tok, 1, where="row")
    assert text.images is None and text.prompt_ids == tok.encode("a <image> b", add_special_tokens=False)


@pytest.mark.parametrize("family", ["llada_v", "mmada"])
def test_sft_on_image_text_pairs_lowers_the_loss_and_never_masks_the_image(sft_images, tmp_path, family):
    trainer = SFTTrainer(_cfg(sft_images, family, tmp_path / "run"), verbose=False)
    assert trainer.report.kept == 2 and dict(trainer.report.dropped) == {"bad_image": 1}
    assert "pairs.jsonl:3: column 'image': image file 'pics/missing.png' not found" in trainer.report.messages[0]
    mine, batch = trainer.next_micro_batch()
    if family == "llada_v":  # each prompt: its features at 730 positions
        assert batch.image_mask().sum(-1).tolist() == [LLADA_V_IMAGE_POSITIONS] * 2
        assert len(batch.images.features) == 2
    else:  # each prompt: [<|mmu|>, <|soi|>, 64 codes, <|eoi|>, text]
        assert batch.images is None
        for ids in mine:
            assert ids.prompt_ids[:2] == [MMU_ID, SOI_ID] and ids.prompt_ids[2 + MMADA_CODES] == EOI_ID
            assert all(len(trainer.tokenizer) <= t < len(trainer.tokenizer) + 32 for t in ids.prompt_ids[2:66])
    rows = plan_rows(trainer.dlm, "random_mask", batch, torch.Generator().manual_seed(0), lo=0.5, hi=1.0)
    p = batch.prompt_len
    assert torch.equal(rows.input_ids[:, :p], batch.prompt_ids[rows.sample])  # the prompt, image included, is clean
    assert rows.weight.shape[1] == batch.completion_len  # only completion tokens have weights
    assert bool((rows.input_ids[:, p:] == trainer.dlm.mask_token_id).any())
    before = _fixed_loss(trainer)
    result = trainer.run()
    after = _fixed_loss(trainer)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert after < 0.6 * before, (before, after)  # the fixed pairs (batch 2 = the whole set) are learnt
    assert (result.model_dir / "vq_model" / "config.json").is_file() == (family == "mmada")


def test_an_image_row_for_a_text_model_is_one_line(sft_images, tmp_path):
    from dllm_rl.models import build_model, save_model, tiny_config

    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=1)
    save_model(build_model("llada", cfg), sft_images / "llada", tokenizer=tok)
    trainer = SFTTrainer(_cfg(sft_images, "llada", tmp_path / "run"), verbose=False)
    with pytest.raises(UserError, match="^the prompts carry images, but a llada model reads text only; use a model "
                                        "of an image family \\(llada_v, mmada\\) or a text task$"):
        trainer.next_micro_batch()
    trainer.close()


def test_a_fresh_llada_v_takes_its_tower_shape_from_the_model_section():
    """``model.family: llada_v`` with ``model.vision_*`` builds the demo's shape: a 48 px image in 16 px patches is
    9 patches + the newline = 10 prompt positions; sizes that do not tile are one ConfigError naming both keys."""
    from dllm_rl.config import ConfigError
    from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images
    from dllm_rl.sft.config import ModelConfig
    from dllm_rl.sft.model_build import build_tokenizer_and_model

    shape = dict(family="llada_v", tokenizer="char", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                 intermediate_size=64, vision_image_size=48, vision_patch_size=16, vision_hidden_size=32,
                 vision_num_heads=4, vision_num_layers=3, image_aspect_ratio="pad")
    tok, dlm = build_tokenizer_and_model(ModelConfig(**shape))
    tower = dlm.published_config["vision_config"]
    assert (tower["image_size"], tower["patch_size"], tower["hidden_size"], tower["num_attention_heads"],
            tower["num_hidden_layers"], tower["intermediate_size"]) == (48, 16, 32, 4, 3, 64)
    assert dlm.published_config["mm_hidden_size"] == 32 and dlm.published_config["image_aspect_ratio"] == "pad"
    assert len(dlm.causal_lm.model.vision_tower.encoder.layers) == 2  # the published deletion
    widened, _ = prompt_images(dlm, [[IMAGE_TOKEN_INDEX, 5]], [[draw_scene(SCENE, 48)]])
    assert len(widened[0]) == 10 + 1
    with pytest.raises(ConfigError, match=r"vision_image_size=48 is not a multiple of model.vision_patch_size=14"):
        ModelConfig(**{**shape, "vision_patch_size": 14})


@pytest.mark.parametrize("train", ["none", "projector", "all"])
def test_train_vision_says_which_image_parts_train(sft_images, tmp_path, train):
    """``model.train_vision``: none leaves the tower, projector and image newline as loaded (the features are
    data, as published); projector trains the projector and the newline over a frozen tower; all trains the tower
    too. The language model trains in every case, and the gradient reaches exactly the parts named."""
    trainer = SFTTrainer(_cfg(sft_images, "llada_v", tmp_path / "run", "train.max_steps=2",
                              f"model.train_vision={train}"), verbose=False)
    core = trainer.dlm.causal_lm.model
    parts = {"tower": core.vision_tower, "projector": core.multi_modal_projector}
    before = {k: [p.detach().clone() for p in m.parameters()] for k, m in parts.items()}
    newline, lm_head = core.image_newline.detach().clone(), trainer.dlm.causal_lm.lm_head.weight.detach().clone()
    trainer.run()
    moved = {k: any(not torch.equal(a, b) for a, b in zip(before[k], m.parameters())) for k, m in parts.items()}
    assert moved == {"tower": train == "all", "projector": train != "none"}
    assert (not torch.equal(newline, core.image_newline)) == (train != "none")
    assert not torch.equal(lm_head, trainer.dlm.causal_lm.lm_head.weight)


def test_train_vision_outside_llada_v_or_with_lora_is_one_line(sft_images, tmp_path):
    from dllm_rl.config import ConfigError

    with pytest.raises(ConfigError, match=r"^model.train_vision=all: for llada_v models only \(a mmada model"):
        SFTTrainer(_cfg(sft_images, "mmada", tmp_path / "a", "model.train_vision=all"), verbose=False)
    with pytest.raises(ConfigError, match=r"^model.train_vision=projector: LoRA adapts the language model only"):
        SFTTrainer(_cfg(sft_images, "llada_v", tmp_path / "b", "model.train_vision=projector", "lora.enabled=true"),
                   verbose=False)
