"""WeightEMA: hand-computed averages, the warm-up mean, the swap in and out, LoRA, save / load."""

import pytest
import torch

from dllm_rl.training import WeightEMA


def _set(module, value):
    with torch.no_grad():
        module.weight.fill_(value)


def test_running_mean_until_the_horizon_then_exponential():
    lin = torch.nn.Linear(1, 1, bias=False)
    ema = WeightEMA(lin, decay=0.8)  # horizon 1 / (1 - 0.8) = 5 updates
    seen = []
    for w in [1.0, 2.0, 3.0, 4.0, 5.0]:  # decays 0, 1/2, 2/3, 3/4, 4/5: the plain mean of what was seen
        _set(lin, w)
        ema.update()
        seen.append(w)
        assert ema.shadow[0].item() == pytest.approx(sum(seen) / len(seen), abs=1e-6)
    _set(lin, 13.0)
    ema.update()  # from here on the decay is 0.8: 0.8 * 3 + 0.2 * 13 = 5
    assert ema.shadow[0].item() == pytest.approx(5.0, abs=1e-6)
    assert ema.updates == 6
    assert lin.weight.item() == 13.0  # the live weights are never touched by an update


def test_applied_swaps_the_average_in_and_the_live_weights_back():
    lin = torch.nn.Linear(2, 1)
    ema = WeightEMA(lin, decay=0.5)
    _set(lin, 2.0)
    ema.update()
    _set(lin, 4.0)
    ema.update()  # decay min(0.5, 1/2): (2 + 4) / 2 = 3
    live_bias = lin.bias.detach().clone()
    x = torch.ones(1, 2)
    with ema.applied():
        assert torch.equal(lin.weight, torch.full((1, 2), 3.0))
        out = lin(x)
    assert torch.equal(lin.weight, torch.full((1, 2), 4.0)) and torch.equal(lin.bias, live_bias)
    assert out.item() == pytest.approx(6.0 + live_bias.item(), abs=1e-6)  # the bias was constant: its mean
    with pytest.raises(RuntimeError, match="inside"), ema.applied():
        raise RuntimeError("inside")
    assert torch.equal(lin.weight, torch.full((1, 2), 4.0))  # restored even when the block raises


def test_an_average_of_no_updates_is_the_live_weights():
    lin = torch.nn.Linear(1, 1, bias=False)
    _set(lin, 1.0)
    ema = WeightEMA(lin, decay=0.5)  # the shadow holds 1.0, the weights at construction
    _set(lin, 5.0)  # trained before the average starts (train.ema_start)
    with ema.applied():
        assert lin.weight.item() == 5.0
    ema.update()
    _set(lin, 7.0)
    with ema.applied():
        assert lin.weight.item() == 5.0  # one update: the weights it saw


def test_only_trainable_parameters_are_averaged():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].requires_grad_(False)  # frozen, as a LoRA base
    ema = WeightEMA(model, decay=0.9)
    assert ema.names == ["1.weight", "1.bias"]
    frozen = model[0].weight.detach().clone()
    with ema.applied():
        assert torch.equal(model[0].weight, frozen)


def test_state_round_trip_and_mismatch(tmp_path):
    lin = torch.nn.Linear(1, 1, bias=False)
    ema = WeightEMA(lin, decay=0.5)
    for w in (1.0, 3.0, 7.0):
        _set(lin, w)
        ema.update()
    ema.save(tmp_path / "ema.pt")
    other = WeightEMA(torch.nn.Linear(1, 1, bias=False), decay=0.5)
    other.load(tmp_path / "ema.pt")
    assert other.updates == 3 and torch.equal(other.shadow[0], ema.shadow[0])
    with pytest.raises(ValueError, match="does not match"):
        WeightEMA(torch.nn.Linear(1, 1), decay=0.5).load(tmp_path / "ema.pt")
    _set(lin, 9.0)
    ema.reset()  # a checkpoint without an average: it starts over from the live weights
    assert ema.updates == 0 and ema.shadow[0].item() == 9.0
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        WeightEMA(lin, decay=1.0)
