"""2-step ESPO and TraceRL runs on tiny LLaDA2.x, LLaDA-MoE, SDAR-MoE and Fast-dLLM v2 checkpoints, with the
router statistics in the metrics and frozen routers."""

import json
import math

import pytest
import torch
from rl_helpers import countdown_root, digit_reward, rl_overrides

from dllm_rl.config import load_config
from dllm_rl.models import load_model
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train

NEW = ["llada2", "llada_moe", "sdar_moe", "fast_dllm_v2"]


@pytest.fixture(scope="module")
def new_setup(tmp_path_factory):
    return countdown_root(tmp_path_factory.mktemp("rl_new"), NEW, 16, 4, hidden_size=32, intermediate_size=64,
                          num_heads=2, num_kv_heads=1)


def _weights(path):
    return {k: v.clone() for k, v in load_model(path).hf_model.state_dict().items()}


@pytest.mark.parametrize("family", NEW)
@pytest.mark.parametrize("algorithm", ["espo", "tracerl"])
def test_two_steps_train_every_new_family(new_setup, tmp_path, family, algorithm):
    cfg = load_config(RLConfig, None, rl_overrides(new_setup, family, tmp_path, f"algorithm={algorithm}",
                                                   "train.max_steps=2", "drop_zero_variance=false"))
    summary = train(cfg, reward_fn=digit_reward)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [m for m in rows if "loss" in m]
    assert len(rows) == 2 and all(math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in rows)
    before, after = _weights(new_setup / family), _weights(summary["final_model"])
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2
    if family != "fast_dllm_v2":  # MoE: load per expert (1 = uniform) and router entropy <= log(4)
        for m in rows:
            assert 0 <= m["moe_load_min"] <= 1 <= m["moe_load_max"] <= 4
            assert 0 < m["moe_router_entropy"] <= m["moe_router_entropy_max"] == pytest.approx(math.log(4))
    else:
        assert not any(k.startswith("moe_") for k in rows[0])


@pytest.mark.parametrize("family", ["llada2", "sdar_moe"])
def test_freeze_router_keeps_the_gates_and_trains_the_rest(new_setup, tmp_path, family):
    cfg = load_config(RLConfig, None, rl_overrides(new_setup, family, tmp_path, "algorithm=espo", "train.max_steps=1",
                                                   "drop_zero_variance=false", "model.freeze_router=true"))
    summary = train(cfg, reward_fn=digit_reward)
    before, after = _weights(new_setup / family), _weights(summary["final_model"])
    gates = [k for k in before if k.endswith("mlp.gate.weight")]
    assert gates and all(torch.equal(before[k], after[k]) for k in gates)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".mlp.experts." in k)


def test_fast_dllm_v2_rollouts_in_sub_blocks(new_setup, tmp_path):
    """``rollout.sub_block`` reaches the rollouts and the evaluation; a schedule without a threshold is refused by
    name before anything runs."""
    from dllm_rl.config import ConfigError
    from dllm_rl.rl.config import decode_config

    model = load_model(new_setup / "fast_dllm_v2")
    args = rl_overrides(new_setup, "fast_dllm_v2", tmp_path, "algorithm=tracerl", "train.max_steps=1",
                        "drop_zero_variance=false", "rollout.sub_block=2", "rollout.threshold=0.5")
    cfg = load_config(RLConfig, None, args)
    assert decode_config(cfg, model).sub_block == 2
    with pytest.raises(ConfigError, match=r"rollout.sub_block \(2\) needs the dynamic schedule here: set "
                                          r"eval.threshold"):
        decode_config(cfg, model, evaluation=True)
    cfg = load_config(RLConfig, None, [*args, "eval.threshold=0.5"])
    assert decode_config(cfg, model, evaluation=True).sub_block == 2
    train(cfg, reward_fn=digit_reward)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [(m["step"], m["loss"]) for m in rows if "loss" in m]
    assert [s for s, _ in losses] == [1] and all(math.isfinite(v) for _, v in losses)
