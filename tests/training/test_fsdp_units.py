"""FSDP2's units on LLaDA-V: the shipped fsdp2.yaml (``LlamaDecoderLayer``) read by accelerate's launcher and
plugin, then the policy accelerate's ``fsdp2_prepare_model`` applies, listed without a GPU or a process group."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_multi_gpu_env

from dllm_rl.models import build_model, tiny_config
from dllm_rl.training.sharding import add_family_units, fsdp2_plan

FSDP2_YAML = Path(__file__).resolve().parents[2] / "configs" / "accelerate" / "fsdp2.yaml"


@pytest.fixture
def plugin(monkeypatch):
    """accelerate's FSDP2 plugin as a rank of ``accelerate launch --config_file configs/accelerate/fsdp2.yaml``
    builds it."""
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", str(FSDP2_YAML), "train.py"]))
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    made = FullyShardedDataParallelPlugin()
    assert made.fsdp_version == 2 and made.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    return made


def _tiny(family):
    return build_model(family, tiny_config(family, vocab_size=32, hidden_size=32, intermediate_size=64), seed=0)


def test_llada_v_siglip_layers_and_projector_are_units_of_their_own(plugin):
    dlm = _tiny("llada_v")
    # what the launch config alone makes of it: the tower and projector stay in the root unit
    assert fsdp2_plan(plugin, dlm.model) == ["model.language_model.layers.0", "model.language_model.layers.1"]
    add_family_units(plugin)
    assert fsdp2_plan(plugin, dlm.model) == [
        "model.vision_tower.encoder.layers.0", "model.vision_tower.encoder.layers.1",
        "model.multi_modal_projector",
        "model.language_model.layers.0", "model.language_model.layers.1",
    ]
    assert plugin.transformer_cls_names_to_wrap == [
        "LlamaDecoderLayer", "SiglipEncoderLayer", "LlavaOnevisionMultiModalProjector"]
    # SFT prepares the DiffusionLM itself: the same units under its "model." prefix
    assert fsdp2_plan(plugin, dlm) == [f"model.{n}" for n in fsdp2_plan(plugin, dlm.model)]


def test_text_families_keep_the_decoder_layers_only(plugin):
    add_family_units(plugin)
    add_family_units(plugin)  # once per plugin
    assert fsdp2_plan(plugin, _tiny("mmada").model) == ["model.layers.0", "model.layers.1"]
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
