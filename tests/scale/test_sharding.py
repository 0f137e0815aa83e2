"""dllm_rl.training.sharding on two real CPU ranks (gloo), under the backends that shard parameters: FSDP2 and
DeepSpeed ZeRO-3 (DDP and ZeRO-2 hold full parameters, and the trainer tests in test_sharded_trainers.py run
all five backends against one process).

Each backend is launched with the shipped accelerate config (configs/accelerate/fsdp2.yaml with 2 processes
and the Qwen3 layer class, configs/accelerate/zero3.yaml). After 2 AdamW steps the weights equal a 1-process
run on the same 4 rows; the full state dict reaches rank 0 (and, on request, every rank); the
gathered-parameter context lets rank 0 run 3 forwards while rank 1 runs 1 (no collective inside, so no hang)
with the full model's logits; training goes on after it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import sharding_driver as driver  # tests/scale is on sys.path (pytest rootdir-less test modules)
import torch
from two_ranks import free_port, run_ranks

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "accelerate"
# FSDP2 (like DDP) matches the 1-process weights within 1e-5 (measured: 7.8e-7). Under DeepSpeed the gradients agree
# within 1.5e-8 (measured with deepspeed.utils.safe_get_full_grad), yet after the first AdamW step a handful of
# weights whose gradient is tiny (|g| < 4e-6) differ by up to ~0.075 x lr (measured 3.4e-4 to 7.5e-4 at lr 1e-2;
# cause not pinned down, see docs/scale-notes.md), so the DeepSpeed rows allow 1e-3.
TOLERANCE = {"fsdp2": 1e-5, "zero3": 1e-3}


def _launch(tmp_path: Path, config: str, *extra: str) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()), *extra,
           str(Path(driver.__file__)), str(tmp_path)]
    rc, log = run_ranks(cmd, env, tmp_path, 180, "2-rank run hung (a collective only one rank reached?)")
    assert rc == 0, log[-6000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _one_process() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The same 2 steps on all 4 rows in this process, and the probe logits of the result."""
    model = driver.tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=driver.LR)
    for _ in range(driver.STEPS):
        loss = model(input_ids=driver.batch(), labels=driver.batch()).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        return model.state_dict(), model(input_ids=driver.probe()).logits


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "extra", "backend", "model", "param_type"),
    [("fsdp2.yaml", ("--fsdp_transformer_layer_cls_to_wrap", "Qwen3DecoderLayer"), "fsdp2",
      "FSDPQwen3ForCausalLM", "DTensor"),
     ("zero3.yaml", ("--gradient_clipping", "0"), "zero3", "DeepSpeedEngine", "Parameter")],
)
def test_two_ranks_match_one_process(tmp_path, config, extra, backend, model, param_type):
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed)")
    reports = _launch(tmp_path, config, *extra)
    assert [(r["backend"], r["model"], r["param_type"]) for r in reports] == [(backend, model, param_type)] * 2
    assert [r["forwards"] for r in reports] == [3, 1]
    ref_state, ref_logits = _one_process()

    saved = torch.load(tmp_path / "saved_rank0.pt", weights_only=True)
    assert _max_diff(saved, ref_state) <= TOLERANCE[backend]
    for rank in (0, 1):
        everywhere = torch.load(tmp_path / f"all_ranks_rank{rank}.pt", weights_only=True)
        assert _max_diff(everywhere, saved) == 0.0
        logits = torch.load(tmp_path / f"probe_rank{rank}.pt", weights_only=True)
        assert (logits - ref_logits).abs().max().item() <= 100 * TOLERANCE[backend]
    assert all(r["loss_after_gather"] > 0 for r in reports)
