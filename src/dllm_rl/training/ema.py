"""An exponential moving average (EMA) of a module's trainable weights, swapped in to evaluate or save.

Written here rather than taken from ``torch.optim.swa_utils.AveragedModel``: that class keeps a second copy
of the whole module (with LoRA, the frozen base too) and evaluates it as a separate module. This keeps only
the trainable tensors and swaps them into the live module for evaluation and saving, so LoRA, DDP wrapping
and the model's own forward stay as they are.

Warm-up: update ``t`` (from 0) uses the decay ``min(decay, t / (t + 1))``, so until the EMA's horizon
``1 / (1 - decay)`` is reached the average is the plain mean of every update so far (the starting weights
are not part of it), and a run shorter than the horizon does not return weights pulled back to its start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from dllm_rl.training.disk_full import torch_save


class WeightEMA:
    """EMA of ``module``'s trainable parameters. Call :meth:`update` after each training step (here: each
    RL step); ``with ema.applied(): ...`` runs code with the averaged weights in place of the live ones."""

    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ema decay must be in [0, 1), got {decay}")
        self.decay = decay
        trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in trainable]
        self.params = [p for _, p in trainable]
        self.shadow = [p.detach().clone() for p in self.params]
        self.updates = 0

    def reset(self) -> None:
        """Start over from the live weights (no updates yet)."""
        with torch.no_grad():
            torch._foreach_copy_(self.shadow, [p.detach() for p in self.params])
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        d = min(self.decay, self.updates / (self.updates + 1))
        torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1.0 - d)
        self.updates += 1

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the live module for the duration of the block, then the live ones back. An
        average of no updates yet (before the first, or a late start) is the live weights."""
        if self.updates == 0:
            yield
            return
        with torch.no_grad():
            live = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.detach() for p in self.params], self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], live)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates,
                "shadow": {n: t.cpu() for n, t in zip(self.names, self.shadow, strict=True)}}

    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        if sorted(shadow) != sorted(self.names):
            raise ValueError("ema state does not match the model's trainable parameters")
        for n, t in zip(self.names, self.shadow, strict=True):
            t.copy_(shadow[n])
        self.updates = int(state["updates"])

    def save(self, path: str | Path) -> None:
        torch_save(self.state_dict(), path)  # a full disk keeps its ENOSPC

    def load(self, path: str | Path) -> None:
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
