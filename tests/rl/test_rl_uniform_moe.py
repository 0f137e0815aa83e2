"""A DiffusionGemma RL step with frozen routers: the gates of both stacks (tied twins) keep their weights, the
experts train, and the router statistics of the rollouts are in the metrics."""

from __future__ import annotations

import json
import math

import pytest
import torch
from rl_helpers import countdown_root, digit_reward, gemma_overrides, tiny_gemma

from dllm_rl.config import load_config
from dllm_rl.models import load_model
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_gemma(countdown_root(tmp_path_factory.mktemp("gemma_moe"), (), 16, 2))


def _weights(path):
    return {k: v.clone() for k, v in load_model(path).hf_model.state_dict().items()}


def test_freeze_router_keeps_both_stacks_gates_and_trains_the_experts(root, tmp_path):
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path, "algorithm=espo", "train.max_steps=1",
                                                      "drop_zero_variance=false", "model.freeze_router=true"))
    summary = train(cfg, reward_fn=digit_reward)
    before, after = _weights(root / "diffusion_gemma"), _weights(summary["final_model"])
    gates = [k for k in before if ".router." in k]
    assert {k.split(".layers.")[0] for k in gates} == {"model.encoder.language_model", "model.decoder"}
    assert all(torch.equal(before[k], after[k]) for k in gates)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".experts." in k)
    rows = [m for m in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert len(rows) == 1 and math.isfinite(rows[0]["loss"])
    assert 0 <= rows[0]["moe_load_min"] <= 1 <= rows[0]["moe_load_max"] <= 4
    assert 0 < rows[0]["moe_router_entropy"] <= rows[0]["moe_router_entropy_max"] == pytest.approx(math.log(4))


def test_lora_run_trains_one_adapter_for_both_stacks(root, tmp_path):
    """TraceRL with LoRA: the final (merged) model's encoder weights equal its decoder's, and they moved."""
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path, "algorithm=tracerl", "train.max_steps=1",
                                                      "drop_zero_variance=false", "lora.enabled=true", "lora.r=2",
                                                      "optim.lr=1e-2"))
    summary = train(cfg, reward_fn=digit_reward)
    before, after = _weights(root / "diffusion_gemma"), _weights(summary["final_model"])
    enc, dec = "model.encoder.language_model.", "model.decoder."
    moved = [k for k in after if k.startswith(dec + "layers.") and not torch.equal(before[k], after[k])]
    assert moved and all(k.endswith("_proj.weight") for k in moved)
    assert all(torch.equal(after[enc + k.removeprefix(dec)], after[k]) for k in moved)
