"""The one device resolution (models/devices.py resolve_device): ``auto`` falls back to the CPU, anything else must
name a device the machine has; every command refuses a missing one in one line (exit 2) naming its key and the
devices there are. CUDA is faked where a test needs it (this machine may have none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.errors import UserError
from dllm_rl.models import devices
from dllm_rl.models.devices import resolve_device
from dllm_rl.training.accel import training_device

DEMO = Path(__file__).resolve().parents[2] / "src" / "dllm_rl" / "assets" / "demo"


@pytest.fixture()
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(devices, "available_devices", lambda: ["cpu"])


@pytest.fixture()
def two_gpus(monkeypatch):
    """A machine with cuda:0 and cuda:1 (and the current device that training_device sets, recorded)."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return current


def test_auto_falls_back_and_a_missing_or_unknown_device_is_refused_naming_the_key(no_cuda):
    assert resolve_device("auto", "model.device") == torch.device("cpu")
    assert resolve_device("cpu", "model.device") == torch.device("cpu")
    for device, message in (
        ("cuda:7", "model.device 'cuda:7': this machine has no cuda device (it has: cpu); use auto or cpu"),
        ("cuda", "model.device 'cuda': this machine has no cuda device (it has: cpu); use auto or cpu"),
        ("gpu0", "model.device 'gpu0': not a torch device; use auto, cpu, cuda or cuda:N (this machine has: cpu)"),
    ):
        with pytest.raises(UserError) as info:
            resolve_device(device, "model.device")
        assert str(info.value) == message


def test_an_index_beyond_the_gpus_is_refused_and_a_single_process_honours_one(two_gpus, monkeypatch):
    assert resolve_device("auto", "--device") == torch.device("cuda")
    assert resolve_device("cuda:1", "--device") == torch.device("cuda", 1)
    with pytest.raises(UserError, match=r"^--device 'cuda:2': this machine has 2 cuda device\(s\) \(cuda:0, cuda:1\); "
                                        r"use one of them, or auto$"):
        resolve_device("cuda:2", "--device")
    # a trainer: accelerate's one-process device is the current CUDA device, so cuda:1 makes it current
    assert training_device("cuda:1", "model.device") is False and two_gpus == [1]
    assert training_device("cuda", "model.device") is False and two_gpus == [1]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"^model.device 'cuda:1': each of the 2 launched processes uses its own device "
                                        r"\(cuda:LOCAL_RANK\); set model.device=cuda or auto$"):
        training_device("cuda:1", "model.device")


def _commands(tmp_path: Path, device: str) -> dict[str, list[str]]:
    """Every command that takes a device, as a command line on the demo model and data."""
    model, data = str(DEMO / "sdar-countdown"), str(DEMO / "countdown_train.jsonl")
    return {
        "rl": ["rl", str(DEMO / "rl-block.yaml"), f"model.path={model}", f"data.train_file={data}",
               f"run.output_dir={tmp_path / 'rl'}", f"model.device={device}"],
        "generate": ["generate", model, "--prompt", "nums 1 2 3 target 6", "--device", device],
        "eval": ["eval", model, "--task", "countdown", "--data", data, "--limit", "1", "-o", str(tmp_path / "ev"),
                 "--model.device", device],
        "pairs": ["pairs", "--model.path", model, "--task", "countdown", "--data", data, "--limit", "1", "--out",
                  str(tmp_path / "pairs.jsonl"), "--model.device", device],
        "serve": ["serve", model, "--device", device],
    }


@pytest.mark.parametrize("device,problem", [
    ("cuda:7", "'cuda:7': this machine has no cuda device (it has: cpu); use auto or cpu"),
    ("gpu0", "'gpu0': not a torch device; use auto, cpu, cuda or cuda:N (this machine has: cpu)"),
])
def test_every_command_refuses_a_device_the_machine_lacks_in_one_line(no_cuda, tmp_path, capsys, device, problem):
    """``model.device=cuda:7`` on a machine without CUDA used to train on the CPU and record cuda:7 in config.yaml;
    generate, serve and pairs ended in a traceback. Each refuses it before loading anything."""
    for name, argv in _commands(tmp_path, device).items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        key = "model.device" if name in ("rl", "generate", "serve", "eval", "pairs") else "--device"
        assert err.strip().splitlines()[-1] == f"dllm-rl {name}: error: {key} {problem}", err
        assert "Traceback" not in err
    assert not (tmp_path / "rl").exists()  # no config.yaml naming the device it did not run on
