"""One rank of the 2-rank FSDP2 test on a tiny DiffusionGemma (started by ``accelerate launch``; see
test_tied_units.py): the trainers' backend set-up, 2 AdamW steps on this rank's rows of the stock forward (encoder
over a prompt, decoder over a canvas), then the full state dict on rank 0 in OUT/sd.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.training import make_accelerator
from dllm_rl.training.accel import end_distributed
from dllm_rl.training.backend import setup_backend
from dllm_rl.training.sharding import full_state_dict

STEPS, LR = 2, 1e-2


def tiny_model() -> torch.nn.Module:
    cfg = tiny_config("diffusion_gemma", vocab_size=64, hidden_size=16, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    return build_model("diffusion_gemma", cfg, seed=0).hf_model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, 60, (4, 5), generator=g), torch.randint(3, 60, (4, 4), generator=g)


def loss_of(model, prompt, canvas) -> torch.Tensor:
    return model(input_ids=prompt, decoder_input_ids=canvas).logits.logsumexp(-1).mean()


def main(out: Path) -> None:
    model = tiny_model()
    acc = make_accelerator(mixed_precision="no", cpu=True)
    assert setup_backend(acc, micro_batch_size=2) == "fsdp2"
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = acc.prepare(model, optimizer)
    rank = acc.process_index
    prompt, canvas = (x[rank * 2:(rank + 1) * 2] for x in batch())
    for _ in range(STEPS):
        acc.backward(loss_of(model, prompt, canvas))
        optimizer.step()
        optimizer.zero_grad()
    state = full_state_dict(acc, model)
    if rank == 0:
        torch.save(state, out / "sd.pt")
    del model, optimizer
    end_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
