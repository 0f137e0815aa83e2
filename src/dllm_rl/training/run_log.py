"""``rollouts.jsonl``: a few samples of each RL step (prompt, completion, reward, reason), written next to the
metrics log; a resumed run first drops the rows of steps after its checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dllm_rl.jsonl import append_jsonl, keep_rows_through

ROLLOUTS_FILE = "rollouts.jsonl"


class RolloutLog:
    """Append the samples of a step to ``path``; ``enabled=False`` (non-main ranks) writes nothing."""

    def __init__(self, path: str | Path, *, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def truncate(self, step: int) -> None:
        """Drop what a run killed after the checkpoint of ``step`` wrote."""
        if self.enabled:
            keep_rows_through(self.path, step)

    def log(self, step: int, samples: Sequence[tuple[str, str, float, str]]) -> None:
        """One row per ``(prompt, completion, reward, reason)``."""
        if self.enabled and samples:
            append_jsonl(self.path, [
                {"step": step, "prompt": p, "completion": c, "reward": r, "reason": why}
                for p, c, r, why in samples])
