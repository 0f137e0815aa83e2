"""RL on an image task (shapes) with tiny LLaDA-V and MMaDA models: each prompt's image reaches the rollouts (a
group's image encoded once), every scoring batch (old, reference and current policy), the value model and the
held-out evaluation."""

from __future__ import annotations

import json
import math

import pytest
import torch
from image_fixture import LLADA_V_IMAGE_POSITIONS as IMAGE_POSITIONS
from image_fixture import MMADA_CODES
from PIL import Image
from rl_helpers import alternating_reward, image_overrides

from dllm_rl.config import load_config
from dllm_rl.estimators import ScoringBatch
from dllm_rl.models import load_model
from dllm_rl.models.families.mmada import EOI_ID, MMU_ID, SOI_ID
from dllm_rl.models.image_inputs import image_key
from dllm_rl.models.llava_images import IMAGE_TOKEN_INDEX, prompt_images
from dllm_rl.models.mmada_image import image_transform
from dllm_rl.models.prompt_images import PromptImages
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.rl.value import ValueModel, token_values


def _trainer(root, family, out, *extra):
    cfg = load_config(RLConfig, None, image_overrides(root, family, out, *extra))
    return RLTrainer(cfg, reward_fn=alternating_reward)


def _spy(trainer):
    """Record the examples each encoding sees and the batch of every policy / old / reference scoring call."""
    seen, scored = [], []
    encode, scores = trainer.prompts.task_prompts, trainer.updater.scores

    def task_prompts(model, task, examples):
        seen.append([task.images(ex)[0] for ex in examples])
        return encode(model, task, examples)

    def record(model, batch, gen_seed, **kw):
        scored.append(batch)
        return scores(model, batch, gen_seed, **kw)

    trainer.prompts.task_prompts, trainer.updater.scores = task_prompts, record
    return seen, scored


@pytest.mark.parametrize("family", ["llada_v", "mmada"])
def test_an_rl_run_on_shapes_trains_both_image_families(image_rl_setup, tmp_path, family):
    summary = train(load_config(RLConfig, None, image_overrides(image_rl_setup, family, tmp_path, "train.max_steps=2")),
                    reward_fn=alternating_reward)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in rows if "loss" in m]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    # the held-out evaluation of 2 items scores with the run's reward (1, 0): 0.5 before and after
    assert summary["accuracy_before"] == 0.5 and summary["accuracy_after"] == 0.5
    assert [m["eval_accuracy"] for m in rows if "eval_accuracy" in m] == [0.5, 0.5]
    before, after = load_model(image_rl_setup / family), load_model(summary["final_model"])
    changed = [k for k, v in before.hf_model.state_dict().items() if not torch.equal(v, after.hf_model.state_dict()[k])]
    assert any(".layers.0." in k for k in changed)  # the language model trained
    # MMaDA's image tokenizer travels with the trained model
    assert (tmp_path / "final" / "vq_model" / "model.safetensors").is_file() == (family == "mmada")


def test_llada_v_encodes_each_distinct_image_once_per_round_and_every_scoring_sees_it(image_rl_setup, tmp_path):
    """The vision tower runs once per rollout round over the round's distinct images (G = 2 samples share one
    encoding) and once per held-out evaluation; the old, reference and current policy's scorings splice the
    rollout's features (730 positions per row) without running the tower again."""
    trainer = _trainer(image_rl_setup, "llada_v", tmp_path, "train.num_iterations=2")
    tiles = []
    tower = trainer.model.causal_lm.model.vision_tower
    handle = tower.register_forward_hook(lambda m, args, out: tiles.append(int(args[0].shape[0])))
    seen, scored = _spy(trainer)
    try:
        trainer.evaluate()
        assert tiles == [2]  # the 2 held-out images, one call
        batch = trainer.collect()
        distinct = len({image_key(img) for img in seen[-1]})
        assert tiles == [2, distinct] and len(seen[-1]) == 2
        trainer.update(batch)
        assert tiles == [2, distinct]  # scoring reuses the rollout's features
    finally:
        handle.remove()
    pim = batch.rollout.images
    assert [len(r) for r in pim.rows] == [1, 1, 1, 1]
    assert pim.rows[0] == pim.rows[1] and pim.rows[2] == pim.rows[3]  # a group shares one encoding
    for j, img in zip((0, 2), seen[-1]):  # each sample's features are its own prompt's image's
        _, alone = prompt_images(trainer.model, [[IMAGE_TOKEN_INDEX]], [[img]])
        torch.testing.assert_close(pim.features[pim.rows[j][0][1]], alone.features[0], atol=1e-6, rtol=0)
    # old (2 passes need them), reference (beta 0.01) and current scorings, every one with the images
    assert len(scored) == 4  # 1 micro-batch: old, reference, 2 passes of the current policy
    for sb in scored:
        assert sb.images is not None and sb.image_mask().sum(-1).tolist() == [IMAGE_POSITIONS] * sb.batch_size
    trainer.close()


def test_mmada_images_become_vq_codes_in_the_prompt_once_per_distinct_image(image_rl_setup, tmp_path):
    trainer = _trainer(image_rl_setup, "mmada", tmp_path)
    seen, _ = _spy(trainer)
    vq, resolution = trainer.prompts.vq(trainer.model.device)
    encoder_calls = []
    handle = vq.encoder.register_forward_hook(lambda m, args, out: encoder_calls.append(int(args[0].shape[0])))
    try:
        trainer.evaluate()
        batch = trainer.collect()
    finally:
        handle.remove()
    assert encoder_calls == [2, len({image_key(img) for img in seen[-1]})]
    offset = len(trainer.tokenizer)
    for j, img in zip((0, 2), seen[-1]):
        codes = vq.codes(image_transform(img, resolution)[None])[0]
        row = batch.rollout.prompt_ids[j][batch.rollout.prompt_mask[j]].tolist()
        assert row[:2] == [MMU_ID, SOI_ID] and row[2 + MMADA_CODES] == EOI_ID
        assert row[2:2 + MMADA_CODES] == (codes + offset).tolist()
        assert torch.equal(batch.rollout.prompt_ids[j], batch.rollout.prompt_ids[j + 1])
    assert batch.rollout.images is None  # MMaDA's images are prompt ids
    trainer.close()


def _values(vm, dlm, batch):
    with torch.no_grad():
        return token_values(vm, dlm, batch, shrinkage=1)


def _value_setup(trainer):
    """One round of rollouts, its scoring batch, a value model with a random (non-zero) head, and its values."""
    batch = trainer.collect()
    sb = ScoringBatch.from_rollout(batch.rollout)
    vm = ValueModel(trainer.value.backbone)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        vm.head.weight.normal_()
    return batch, sb, vm, _values(vm, trainer.value.backbone, sb)


def test_the_value_model_sees_the_image(image_rl_setup, tmp_path):
    """Values of the same completions under another image's features differ (the value model splices the
    features the policy splices); a TraceRL step with the value model runs on LLaDA-V."""
    trainer = _trainer(image_rl_setup, "llada_v", tmp_path, "algorithm=tracerl", "value_model.enabled=true")
    batch, sb, vm, base = _value_setup(trainer)
    _, blank = prompt_images(trainer.model, [[IMAGE_TOKEN_INDEX]], [[Image.new("RGB", (32, 32), "white")]])
    swapped = ScoringBatch.from_rollout(batch.rollout)
    swapped.images = PromptImages([blank.features[0]] * len(sb.images.features), sb.images.rows)
    other = _values(vm, trainer.value.backbone, swapped)
    counted = base != 0
    assert int(counted.sum()) == int(sb.completion_mask.sum())  # every counted token has a value
    assert float((base - other)[counted].abs().min()) > 1e-3  # ... and each changes with the image
    # the same features give the same values (the change is the image's, nothing else)
    torch.testing.assert_close(_values(vm, trainer.value.backbone, sb), base, atol=0, rtol=0)
    metrics = trainer.step().metrics
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["value_loss"])
    trainer.close()


def test_the_value_model_of_mmada_reads_the_image_codes(image_rl_setup, tmp_path):
    trainer = _trainer(image_rl_setup, "mmada", tmp_path, "algorithm=tracerl", "value_model.enabled=true")
    batch, sb, vm, base = _value_setup(trainer)
    codes = sb.prompt_ids.clone()
    offset = len(trainer.tokenizer)
    is_code = (codes >= offset) & (codes < offset + 32)
    codes[is_code] = offset + (codes[is_code] - offset + 1) % 32  # another image: every code shifted by one
    other = _values(vm, trainer.value.backbone, ScoringBatch(codes, sb.prompt_mask, sb.completion_ids,
                                                             sb.completion_mask, sb.step_map))
    assert int(is_code.sum()) == 4 * MMADA_CODES and float((base - other).abs().max()) > 1e-4
    metrics = trainer.step().metrics
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["value_loss"])
    trainer.close()


def test_prompt_encoder_finds_mmadas_vq_where_configured_and_refuses_what_it_cannot_read(image_rl_setup, tmp_path):
    from dllm_rl.errors import UserError
    from dllm_rl.models import char_tokenizer
    from dllm_rl.models.image_inputs import ImageInputConfig, PromptEncoder

    tok, img = char_tokenizer(), Image.new("RGB", (20, 12), "red")
    mmada = load_model(image_rl_setup / "mmada")
    elsewhere = PromptEncoder(tok, tmp_path, ImageInputConfig(vq_model=str(image_rl_setup / "mmada" / "vq_model")))
    ids, images = elsewhere.encode(mmada, ["<image>\nab"], [[img]])
    assert images is None and ids[0][:2] == [MMU_ID, SOI_ID] and ids[0][-3:] == [EOI_ID, *tok.encode("ab")]
    assert len(ids[0]) == 2 + MMADA_CODES + 1 + 2
    with pytest.raises(UserError, match=f"^MMaDA reads images through a MAGVIT-v2 VQ encoder, and none was found "
                                        f"\\({tmp_path}/vq_model\\): put the showlab/magvitv2 checkpoint in the "
                                        "model's vq_model/ folder or set vq_model$"):
        PromptEncoder(tok, tmp_path).encode(mmada, ["<image>\nab"], [[img]])
    with pytest.raises(UserError, match="^prompt 0 has 2 images; MMaDA's understanding prompt holds one image$"):
        elsewhere.encode(mmada, ["<image><image>ab"], [[img, img]])
    assert PromptEncoder(tok).encode(mmada, ["ab"], None) == ([tok.encode("ab")], None)  # text: unchanged
