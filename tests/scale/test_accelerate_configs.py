"""The launch configs under configs/accelerate/ as accelerate itself reads them.

Each file goes through accelerate's own config loader, then through ``accelerate launch``'s argument
validation and the environment its launcher hands the ranks, and that environment builds accelerate's FSDP
plugin: a misspelt key, a key the launcher does not know or a value it does not accept fails here, not on
a cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
FILES = ["cpu-2proc.yaml", "ddp.yaml", "fsdp2.yaml", "multi-node-fsdp2.yaml", "zero2.yaml", "zero3.yaml",
         "zero3-offload.yaml", "diffusiongemma-64-fsdp2.yaml"]


def _launch_args(name: str | Path):
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(CONFIGS / name), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    # as launch_command does before handing the args to its DeepSpeed launcher
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    return args, {action.dest for action in parser._actions}


def _rank_env(name: str) -> dict[str, str]:
    """The environment ``accelerate launch`` gives each rank for this file."""
    args, _ = _launch_args(name)
    if args.use_deepspeed:
        _, env = prepare_deepspeed_cmd_env(args)
        return env
    return prepare_multi_gpu_env(args)


def test_the_shipped_files_are_the_tested_ones():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(FILES)


def _unknown_nested_keys(path: Path) -> list[str]:
    """Keys of fsdp_config / deepspeed_config that ``accelerate launch`` has no option for (it ignores them)."""
    cfg = load_config_from_file(str(path))
    _, dests = _launch_args(path)
    keys = [k if k.startswith("fsdp") else f"fsdp_{k}" for k in cfg.fsdp_config] + list(cfg.deepspeed_config)
    return [k for k in keys if k not in dests]


@pytest.mark.parametrize("name", FILES)
def test_every_nested_key_is_a_launch_option(name):
    assert _unknown_nested_keys(CONFIGS / name) == []


def test_a_misspelt_key_is_caught(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((CONFIGS / "fsdp2.yaml").read_text().replace("fsdp_version: 2", "fsdp_verison: 2"))
    assert _unknown_nested_keys(bad) == ["fsdp_verison"]


@pytest.mark.parametrize(
    ("name", "kind", "processes", "machines"),
    [("cpu-2proc.yaml", DistributedType.MULTI_GPU, 2, 1), ("ddp.yaml", DistributedType.MULTI_GPU, 8, 1),
     ("fsdp2.yaml", DistributedType.FSDP, 8, 1), ("multi-node-fsdp2.yaml", DistributedType.FSDP, 16, 2),
     ("diffusiongemma-64-fsdp2.yaml", DistributedType.FSDP, 64, 8),
     ("zero2.yaml", DistributedType.DEEPSPEED, 8, 1), ("zero3.yaml", DistributedType.DEEPSPEED, 8, 1),
     ("zero3-offload.yaml", DistributedType.DEEPSPEED, 8, 1)],
)
def test_loader_reads_backend_and_world(name, kind, processes, machines):
    cfg = load_config_from_file(str(CONFIGS / name))
    assert (cfg.distributed_type, cfg.num_processes, cfg.num_machines) == (kind, processes, machines)
    assert cfg.mixed_precision == ("no" if name == "cpu-2proc.yaml" else "bf16")


@pytest.mark.parametrize("name", ["fsdp2.yaml", "multi-node-fsdp2.yaml", "diffusiongemma-64-fsdp2.yaml"])
def test_fsdp2_files_build_accelerates_fsdp2_plugin(name, monkeypatch):
    env = _rank_env(name)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is True
    layer = "DiffusionGemmaDecoderTextLayer" if name.startswith("diffusiongemma") else "LlamaDecoderLayer"
    assert plugin.transformer_cls_names_to_wrap == [layer]
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
    assert plugin.cpu_ram_efficient_loading is True and plugin.activation_checkpointing is False


def test_multi_node_file_takes_rank_and_address_from_the_command_line():
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(CONFIGS / "multi-node-fsdp2.yaml"), "--machine_rank", "1",
                              "--main_process_ip", "10.1.2.3", "--main_process_port", "29600", "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (1, "10.1.2.3", 29600)
    assert (args.num_machines, args.num_processes) == (2, 16)
    assert env["FSDP_VERSION"] == "2"


@pytest.mark.parametrize(
    ("name", "stage", "offload", "save16"),
    [("zero2.yaml", "2", "none", None), ("zero3.yaml", "3", "none", "true"),
     ("zero3-offload.yaml", "3", "cpu", "true")],
)
def test_deepspeed_files_set_stage_and_offload(name, stage, offload, save16):
    env = _rank_env(name)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == stage
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == offload
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == offload
    assert env.get("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL") == save16
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "1"
    assert env["ACCELERATE_GRADIENT_CLIPPING"] == "1.0"


def test_cpu_file_starts_two_ranks_through_the_multi_gpu_launcher():
    args, _ = _launch_args("cpu-2proc.yaml")
    env = prepare_multi_gpu_env(args)
    assert args.multi_gpu and not args.use_fsdp and not args.use_deepspeed
    assert (args.num_processes, int(args.nproc_per_node)) == (2, 2)
    assert "ACCELERATE_USE_FSDP" not in env
