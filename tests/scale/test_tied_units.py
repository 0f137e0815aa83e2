"""FSDP2 on DiffusionGemma, whose encoder layer i and decoder layer i are twins over tied weights (as are the two
embeddings, the LM head and the two final norms): FSDP2 refuses a parameter in two units, so each twin pair is
one unit and the tied leftovers join accelerate's embedding/tail unit. Two CPU ranks (gloo) with the shipped
fsdp2.yaml train 2 steps and end with the weights of one process on the same 4 rows, the twins still equal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import tied_units_driver as driver  # tests/scale is on sys.path
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from two_ranks import free_port, run_ranks

from dllm_rl.training.sharding import _tied_groups, add_family_units

ROOT = Path(__file__).resolve().parents[2]


def test_twin_layers_are_grouped(monkeypatch):
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "DiffusionGemmaDecoderTextLayer")
    plugin = FullyShardedDataParallelPlugin()
    add_family_units(plugin)
    model = driver.tiny_model()
    plugin.set_auto_wrap_policy(model)
    groups = _tied_groups(model, fsdp2_prepare_auto_wrap_policy(plugin, model))
    names = {id(m): n for n, m in model.named_modules()}
    pairs = sorted({tuple(names[id(m)] for m in g) for g in groups.values()})
    assert pairs == [(f"model.encoder.language_model.layers.{i}", f"model.decoder.layers.{i}") for i in (0, 1)]


@pytest.mark.slow
def test_two_fsdp2_ranks_equal_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "fsdp2.yaml"), "--num_processes", "2", "--mixed_precision", "no",
           "--main_process_port", str(free_port()), "--fsdp_transformer_layer_cls_to_wrap",
           "DiffusionGemmaDecoderTextLayer", str(Path(driver.__file__)), str(tmp_path)]
    rc, log = run_ranks(cmd, env, tmp_path, 180, "2-rank DiffusionGemma run hung")
    assert rc == 0, log[-6000:]
    sharded = torch.load(tmp_path / "sd.pt")
    model = driver.tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=driver.LR)
    for _ in range(driver.STEPS):
        driver.loss_of(model, *driver.batch()).backward()
        optimizer.step()
        optimizer.zero_grad()
    one = model.state_dict()
    assert sorted(sharded) == sorted(one)
    assert max((sharded[k] - one[k]).abs().max().item() for k in one) < 1e-5
    enc = "model.encoder.language_model.layers.1.mlp.down_proj.weight"
    assert torch.equal(sharded[enc], sharded[enc.replace("encoder.language_model.", "decoder.")])
