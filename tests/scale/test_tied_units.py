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

from dllm_rl.training.sharding import add_family_units
from dllm_rl.training.tied_units import _tied_groups

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


def test_the_fsdp2_internals_that_tied_units_reads_are_there():
    """training.tied_units reads FSDP2's per-unit pass bookkeeping and calls its lazy init and pre-backward (no public
    call does either): a torch that renames them fails here, not in the middle of a training run."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    state = FSDPState()
    assert state._modules_to_run_forward == set() and state._training_state == TrainingState.IDLE
    assert callable(state._pre_backward) and callable(state._lazy_init) and TrainingState.FORWARD
    assert callable(FSDPModule._get_fsdp_state)


def test_the_wrapper_ties_the_twins_again_after_a_move_to_meta():
    """accelerate's FSDP2 preparation moves the model to the meta device (which unties shared parameters) and calls
    the root's ``tie_weights``; the root the trainers prepare is the DiffusionLM wrapper, which hands it to the HF
    module: the encoder/decoder twins, the embeddings and the LM head are one parameter each again."""
    from dllm_rl.models import build_model, tiny_config

    cfg = tiny_config("diffusion_gemma", vocab_size=64, hidden_size=16, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    dlm = build_model("diffusion_gemma", cfg, seed=0).to(torch.device("meta"))
    hf = dlm.hf_model.model
    enc, dec = hf.encoder.language_model.layers[1].mlp.down_proj, hf.decoder.layers[1].mlp.down_proj
    assert enc.weight is not dec.weight  # what the move leaves
    dlm.tie_weights()
    assert enc.weight is dec.weight
    embed = hf.decoder.embed_tokens.weight
    assert hf.encoder.language_model.embed_tokens.weight is embed and dlm.hf_model.lm_head.weight is embed


@pytest.mark.parametrize("patterns", ["stock", "base_only"])
def test_the_wrapper_ties_the_lora_twins_again_after_a_move_to_meta(monkeypatch, patterns):
    """With LoRA the same move unties each encoder twin's A/B from its decoder twin's (``models.lora_twins.
    tie_lora_twins`` made them one), and the wrapper's ``tie_weights`` makes them one Parameter again, so FSDP2's twin
    units (``training.tied_units``) hold one adapter per pair. The stock ``_tied_weights_keys`` patterns (any
    ``...weight`` under the twin layers) happen to take the adapters' names too; ``base_only`` narrows them to the
    base weights, as a transformers that listed its own names would: the wrapper ties the adapters all the same."""
    from peft.tuners.lora import LoraLayer
    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as stock

    if patterns == "base_only":  # no pattern reaches a name with a lora_ part
        narrow = lambda p: p.replace(r"(?:[^.]+\.)*", r"(?:(?!lora_)[^.]+\.)*")  # noqa: E731
        keys = {narrow(k): narrow(v) for k, v in stock.DiffusionGemmaModel._tied_weights_keys.items()}
        assert keys != stock.DiffusionGemmaModel._tied_weights_keys
        monkeypatch.setattr(stock.DiffusionGemmaModel, "_tied_weights_keys", keys)

    from dllm_rl.models import build_model, tiny_config
    from dllm_rl.training.lora import LoraOptions, apply_lora

    cfg = tiny_config("diffusion_gemma", vocab_size=64, hidden_size=16, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    dlm = apply_lora(build_model("diffusion_gemma", cfg, seed=0), LoraOptions(enabled=True, r=4))
    dlm = dlm.to(torch.device("meta"))
    layers = dict(dlm.model.named_modules())

    def adapters(module) -> list[torch.nn.Parameter]:
        return [*module.lora_A.parameters(), *module.lora_B.parameters()]

    def twins() -> list[bool]:  # per encoder LoRA layer: its A and B are its decoder twin's Parameters
        pairs = [(m, layers[n.replace(".encoder.language_model.", ".decoder.")]) for n, m in layers.items()
                 if isinstance(m, LoraLayer) and ".encoder.language_model." in n]
        return [all(p is q for p, q in zip(adapters(m), adapters(t), strict=True)) for m, t in pairs]

    assert twins() and not any(twins())  # what the move leaves
    dlm.tie_weights()
    assert all(twins())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stock", "scorer"])
def test_two_fsdp2_ranks_equal_one_process(tmp_path, mode):
    """``stock``: the model's own forward. ``scorer``: the uniform scorers' direct calls, self-conditioning's no-grad
    decoder pass between the encoder's and the decoder's grad passes, a canvas appended to the cache (the twins'
    group passes no longer complete in order: a segfault in backward before each call made a pass of its own)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "fsdp2.yaml"), "--num_processes", "2", "--mixed_precision", "no",
           "--main_process_port", str(free_port()), "--fsdp_transformer_layer_cls_to_wrap",
           "DiffusionGemmaDecoderTextLayer", str(Path(driver.__file__)), str(tmp_path), mode]
    rc, log = run_ranks(cmd, env, tmp_path, 180, "2-rank DiffusionGemma run hung")
    assert rc == 0, log[-6000:]
    sharded = torch.load(tmp_path / "sd.pt")
    model = driver.tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=driver.LR)
    for _ in range(driver.STEPS):
        prompt, canvas = driver.batch()
        loss = driver.LOSSES[mode]
        (loss(model, prompt[:2], canvas[:2]) + loss(model, prompt[2:], canvas[2:])).div(2).backward()
        optimizer.step()
        optimizer.zero_grad()
    one = model.state_dict()
    assert sorted(sharded) == sorted(one)
    assert max((sharded[k] - one[k]).abs().max().item() for k in one) < 1e-5
    enc = "model.encoder.language_model.layers.1.mlp.down_proj.weight"
    assert torch.equal(sharded[enc], sharded[enc.replace("encoder.language_model.", "decoder.")])
    gathered = torch.load(tmp_path / "gathered.pt")  # one twin unit gathered at a time, all sharded after backward
    assert gathered == {"twins": 2, "most": 1, "sharded": [True, True]}
