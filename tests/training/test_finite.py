"""The weight guard (training/finite.py): NaN/inf weights and weights' norms that explode or collapse in one update,
which modules it names, and what it costs the host."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dllm_rl.training.finite import Guarded, TrainingStopped, WeightGuard, nonfinite_weights

ONE_PROCESS = SimpleNamespace(num_processes=1)  # what sum_over_ranks reads of a one-process accelerator
HOST_READS = {"cpu", "tolist", "item", "numpy", "__bool__", "__float__", "__int__"}


class HostReads(TorchFunctionMode):
    """Counts the tensor calls that bring a value to the host (each one a device sync on an accelerator)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _module(*values: float, frozen: float | None = None) -> torch.nn.Module:
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(torch.tensor(values))
    m.b = torch.nn.Parameter(torch.zeros(3))
    if frozen is not None:
        m.frozen = torch.nn.Parameter(torch.tensor([frozen]), requires_grad=False)
    return m


def test_names_the_modules_with_a_nan_or_inf_trainable_weight():
    fine, nan, inf = _module(1.0, -3e38), _module(1.0, math.nan), _module(-math.inf, 0.0)
    assert nonfinite_weights(ONE_PROCESS, {"policy": fine, "value model": None}) == []
    assert nonfinite_weights(ONE_PROCESS, {"policy": nan, "value model": fine}) == ["policy"]
    assert nonfinite_weights(ONE_PROCESS, {"policy": fine, "value model": inf}) == ["value model"]
    assert nonfinite_weights(ONE_PROCESS, {"policy": inf, "value model": nan}) == ["policy", "value model"]
    # a frozen weight cannot change in an update: not checked
    assert nonfinite_weights(ONE_PROCESS, {"policy": _module(1.0, frozen=math.nan)}) == []
    assert nonfinite_weights(ONE_PROCESS, {"value model": None}) == []


def test_one_host_read_per_step_whatever_the_number_of_modules():
    """The module docstring's promise: the flags of every module are read in one host sync (it used to be one
    per module, plus one)."""
    modules = {"policy": _module(1.0, math.nan), "value model": _module(2.0, 3.0), "third": _module(4.0)}
    with HostReads() as reads:
        assert nonfinite_weights(ONE_PROCESS, modules) == ["policy"]
    assert reads.calls == ["tolist"]


def _guard(*modules: tuple[str, torch.nn.Module | None, str, float], **kw) -> WeightGuard:
    return WeightGuard(ONE_PROCESS, {name: Guarded(m, key, lr) for name, m, key, lr in modules}, **kw)


def _scaled(module: torch.nn.Module, factor: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)


def test_the_weight_guard_stops_an_update_that_explodes_or_collapses_the_weights_naming_step_lr_and_norms():
    """A finite absurd learning rate used to go unnamed: AdamW moves every weight by about the learning rate, so
    optim.lr=10 or 1e30 leaves finite weights near it, which the NaN check never sees. The guard compares each
    module's norm after a step's update with the norm before it: beyond x2 or below x0.5 the run stops."""
    for factor, words in ((3.0, r"grew from 5\.292 to 15\.87 \(x3\)"), (0.1, r"fell from 5\.292 to 0\.5292 \(x0\.1\)"),
                          (1e30, r"grew from 5\.292 to 5\.292e\+30 \(x1e\+30\)")):  # 1e30: its float32 norm overflows
        policy, value = _module(3.0, 4.0), _module(1.0)
        policy.b.data.fill_(1.0)
        guard = _guard(("policy", policy, "optim.lr", 1e30), ("value model", value, "value_model.lr", 5e-5))
        guard.before()
        _scaled(policy, factor)
        with pytest.raises(TrainingStopped, match=rf"^stopping at step 4: the policy's weights' norm {words} in one "
                           r"update at optim.lr=1e\+30 \(the guard stops a change beyond x2 or x0\.5\); final/ is not "
                           r"written\. Lower the learning rate \(optim.lr\) and start again, or resume from an "
                           r"earlier checkpoint$"):
            guard.check(4)
    # within x2 and x0.5 (AdamW at a sane learning rate changes the norm by far less), nothing happens
    for factor in (1.9, 0.6):
        policy = _module(3.0, 4.0)
        guard = _guard(("policy", policy, "optim.lr", 1e-5), stopping="sft: stopping", output="model/")
        guard.before()
        _scaled(policy, factor)
        guard.check(1)
    # NaN / inf weights are named as before, with each module's learning rate (here from SFT's guard)
    model = _module(1.0, 2.0)
    guard = _guard(("model", model, "optim.lr", math.inf), stopping="sft: stopping", output="model/")
    guard.before()
    model.w.data[0] = math.nan
    with pytest.raises(TrainingStopped, match=r"^sft: stopping at step 2: the update left NaN/inf weights in the model "
                       r"\(optim.lr=inf\); model/ is not written\. Lower the learning rate \(optim.lr\)"):
        guard.check(2)
    # weights that were all zero (a zero-initialised adapter alone) have no scale to compare with
    zero = torch.nn.Linear(2, 2, bias=False)
    zero.weight.data.zero_()
    guard = _guard(("policy", zero, "optim.lr", 1e-4))
    guard.before()
    zero.weight.data.fill_(1.0)
    guard.check(1)


def test_the_weight_guard_reads_the_host_once_per_step():
    """The norms before the update stay on the device; after it, flags and norms of every module are one read."""
    modules = [("policy", _module(1.0, 2.0), "optim.lr", 1e-5), ("value model", _module(3.0), "value_model.lr", 1e-5)]
    guard = _guard(*modules)
    with HostReads() as reads:
        guard.before()
        guard.check(1)
    assert reads.calls == ["tolist"]
