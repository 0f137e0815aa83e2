"""Optimizer / scheduler builders, accelerate set-up and the resumable index stream."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.training import IndexStream, OptimConfig, build_optimizer, build_scheduler, resolve_mixed_precision


def _lrs(cfg: OptimConfig, total: int) -> list[float]:
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_cosine_by_hand():
    lrs = _lrs(OptimConfig(lr=1.0, warmup_steps=2, scheduler="cosine"), 6)
    # warmup 0, 1/2, then 0.5 * (1 + cos(pi * (s - 2) / 4)) for s = 2..5
    hand = [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    assert lrs == pytest.approx(hand, abs=1e-7)


def test_cosine_floor_and_constant():
    lrs = _lrs(OptimConfig(lr=2.0, warmup_steps=0, scheduler="cosine", min_lr_ratio=0.5), 3)
    # floor 1.0: lr = 1 + 1 * 0.5 * (1 + cos(pi * s / 3))
    assert lrs == pytest.approx([2.0, 1 + 0.5 * (1 + math.cos(math.pi / 3)), 1 + 0.5 * (1 + math.cos(2 * math.pi / 3))])
    assert _lrs(OptimConfig(lr=1.0, warmup_steps=1, scheduler="constant"), 4) == pytest.approx([0.0, 1.0, 1.0, 1.0])


def test_no_weight_decay_on_1d_params_and_frozen_params_skipped():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 1))
    model[2].weight.requires_grad_(False)
    opt = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and [p.shape for p in decay["params"]] == [torch.Size([3, 3])]
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 4  # 2 biases + norm weight + norm bias


def test_optim_config_validation():
    with pytest.raises(ValueError, match="lr"):
        OptimConfig(lr=0)
    with pytest.raises(ValueError, match="trainable"):
        build_optimizer(torch.nn.Linear(2, 2).requires_grad_(False), OptimConfig())


def test_mixed_precision_resolution():
    assert resolve_mixed_precision("auto", cpu=True) == "no"
    assert resolve_mixed_precision("bf16") == "bf16"
    if not torch.cuda.is_available():
        assert resolve_mixed_precision("auto") == "no"
    with pytest.raises(ValueError):
        resolve_mixed_precision("fp8")


def test_index_stream_resumes_exactly_and_wraps_epochs():
    a = IndexStream(5, seed=3)
    first = a.take(3)
    state = a.state_dict()
    rest_a = a.take(9)
    b = IndexStream(5, seed=3)
    b.load_state_dict(state)
    assert b.take(9) == rest_a
    epoch0 = first + rest_a[:2]
    assert sorted(epoch0) == [0, 1, 2, 3, 4]  # one epoch is a permutation
    assert sorted(rest_a[2:7]) == [0, 1, 2, 3, 4] and rest_a[2:7] != epoch0  # a fresh permutation
    assert a.state_dict()["epoch"] == 2 and a.consumed == 12
    assert IndexStream(4, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="examples"):
        IndexStream(6).load_state_dict(state)
