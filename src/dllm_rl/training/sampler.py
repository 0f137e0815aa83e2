"""A resumable stream of shuffled dataset indices: the data position is two integers (epoch, offset)."""

from __future__ import annotations

from typing import Any

import torch


class IndexStream:
    """Dataset indices in a fresh permutation each epoch, drawn ``k`` at a time across epoch boundaries.

    Epoch ``e``'s permutation comes from ``torch.Generator().manual_seed(seed + e)``, so the position is
    fully described by ``state_dict() == {"epoch", "offset", "consumed"}`` and resumes exactly.
    ``shuffle=False`` gives 0..n-1 in order every epoch.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        if n < 1:
            raise ValueError("IndexStream: the dataset is empty")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.offset, self.consumed = 0, 0, 0
        self._perm: list[int] | None = None

    def _permutation(self) -> list[int]:
        if self._perm is None:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + self.epoch)
                self._perm = torch.randperm(self.n, generator=g).tolist()
            else:
                self._perm = list(range(self.n))
        return self._perm

    def take(self, k: int) -> list[int]:
        """The next ``k`` indices (wrapping into the next epoch's permutation when needed)."""
        out: list[int] = []
        while len(out) < k:
            perm = self._permutation()
            need = k - len(out)
            chunk = perm[self.offset : self.offset + need]
            out.extend(chunk)
            self.offset += len(chunk)
            if self.offset >= self.n:
                self.epoch, self.offset, self._perm = self.epoch + 1, 0, None
        self.consumed += k
        return out

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.offset / self.n

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "consumed": self.consumed, "n": self.n,
                "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("n", self.n)) != self.n:
            raise ValueError(f"data position was saved for {state['n']} examples, the dataset now has {self.n}")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.consumed = int(state.get("consumed", 0))
        self._perm = None
