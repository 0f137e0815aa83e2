"""One rank of the 2-rank FSDP2 tests on a tiny DiffusionGemma (started by ``accelerate launch``; see
test_tied_units.py): the trainers' backend set-up, 2 AdamW steps on this rank's rows, then the full state dict on
rank 0 in OUT/sd.pt. Mode ``stock``: the stock forward (encoder over a prompt, decoder over a canvas). Mode
``scorer``: the uniform scorers' calls (:func:`scorer_loss`). Rank 0 also writes in OUT/gathered.pt the most twin
units gathered at once at any module call of the forward, and whether every unit is sharded after each step."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dllm_rl.models import build_model, tiny_config
from dllm_rl.sampling.uniform import CanvasContext
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


def scorer_loss(model, prompt, canvas) -> torch.Tensor:
    """As the uniform scorers call the stacks: the prompt through the encoder (with gradient), then per canvas a
    decoder pass without gradient (self-conditioning's first pass) and one with it; the canvas is then encoded into
    the cache and decoded again."""
    ctx = CanvasContext(model, prompt, torch.ones_like(prompt))
    total = torch.zeros(())
    for k in range(2):
        if k:
            ctx.append(canvas)
        with torch.no_grad():
            first = model.lm_head(ctx.hidden(canvas)).float()
        total = total + model.lm_head(ctx.hidden(canvas, first)).float().logsumexp(-1).mean()
    return total


LOSSES = {"stock": loss_of, "scorer": scorer_loss}


def _gathered_twins(model) -> list:
    """The twin units (grouped encoder/decoder layers) of a prepared ``model``, one module each."""
    from torch.distributed.fsdp import FSDPModule

    states = {id(m._get_fsdp_state()): m for m in model.modules()
              if isinstance(m, FSDPModule) and type(m).__name__.endswith("DecoderTextLayer")}
    return [m._get_fsdp_state()._fsdp_param_group for m in states.values()]


def main(out: Path, mode: str = "stock") -> None:
    model = tiny_model()
    acc = make_accelerator(mixed_precision="no", cpu=True)
    assert setup_backend(acc, micro_batch_size=2) == "fsdp2"
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = acc.prepare(model, optimizer)
    rank = acc.process_index
    prompt, canvas = (x[rank * 2:(rank + 1) * 2] for x in batch())
    groups, most, sharded = _gathered_twins(model), [0], []

    def count(*_):
        most[0] = max(most[0], sum(g.is_unsharded for g in groups))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    for _ in range(STEPS):
        acc.backward(LOSSES[mode](model, prompt, canvas))
        sharded.append(all(g.is_sharded for g in groups))
        optimizer.step()
        optimizer.zero_grad()
    handle.remove()
    state = full_state_dict(acc, model)
    if rank == 0:
        torch.save(state, out / "sd.pt")
        torch.save({"twins": len(groups), "most": most[0], "sharded": sharded}, out / "gathered.pt")
    del model, optimizer
    end_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
