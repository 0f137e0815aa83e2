"""The NaN/inf weight guard (training/finite.py): which modules it names, and what it costs the host."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from dllm_rl.training.finite import nonfinite_weights

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
