"""One rank of the 2-rank sharding test (started by ``accelerate launch``; see test_sharding.py).

Trains a tiny SDAR-shaped model 2 steps under whatever backend the launch configured, then writes what the
test checks to OUT/rank{R}.json (+ the full state dicts as .pt files).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.training import make_accelerator
from dllm_rl.training.accel import end_distributed
from dllm_rl.training.sharding import adopt_launch_backend, full_state_dict, gathered_parameters

STEPS = 2
LR = 1e-2


def tiny_model() -> torch.nn.Module:
    cfg = tiny_config("sdar", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64)
    return build_model("sdar", cfg, seed=0).hf_model


def batch() -> torch.Tensor:
    """The 4 rows of every step; rank r of w trains rows [r*4/w, (r+1)*4/w)."""
    return torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))


def probe() -> torch.Tensor:
    return torch.arange(12).reshape(1, 12)


def train_step(model, optimizer, accelerator, ids: torch.Tensor) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def main(out: Path) -> None:
    # Built before the Accelerator: once a ZeRO-3 plugin exists, transformers builds models under
    # deepspeed.zero.Init (partitioned, DeepSpeed's own init), whatever zero3_init_flag says.
    model = tiny_model()
    acc = make_accelerator(mixed_precision="no", cpu=True)
    backend = adopt_launch_backend(acc)
    rank, world = acc.process_index, acc.num_processes
    if backend.startswith("zero"):  # DeepSpeed wants the per-rank batch when no dataloader is prepared
        acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 4 // world
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = acc.prepare(model, optimizer)
    rows = batch()[rank * 4 // world:(rank + 1) * 4 // world]
    for _ in range(STEPS):
        train_step(model, optimizer, acc, rows)
    saved = full_state_dict(acc, model)
    everywhere = full_state_dict(acc, model, all_ranks=True)
    torch.save(saved, out / f"saved_rank{rank}.pt")
    torch.save(everywhere, out / f"all_ranks_rank{rank}.pt")
    forwards = 3 if rank == 0 else 1  # rollouts that stop at different steps on different ranks
    with gathered_parameters(acc, model), torch.no_grad():
        logits = [model(input_ids=probe()).logits for _ in range(forwards)]
    torch.save(logits[0], out / f"probe_rank{rank}.pt")
    param_type = type(next(model.parameters())).__name__
    after = train_step(model, optimizer, acc, rows)  # training still works once resharded
    report = {"backend": backend, "model": type(model).__name__, "param_type": param_type,
              "forwards": len(logits), "loss_after_gather": after}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    del model, optimizer  # the DDP / FSDP module first, then the process group (see end_distributed)
    end_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
