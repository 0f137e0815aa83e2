"""What an engine step copies: bytes of keys/values and image features, per step and since the engine began.

The engine's forwards read the KV pool in place (:mod:`~dllm_rl.sampling.slot_cache`) and write each step's new
columns once, so what a step copies is bounded by the rows' new columns, not by the slots or the positions cached:

* ``kv_written``: keys/values of the columns a forward ran, stored in the pool (each row's block, a joining row's
  prompt, a finished block folded in, a Fast-dLLM refresh of a canvas): the new columns' own size.
* ``kv_moved``: keys/values moved between slots (a running row moved into a hole no newcomer filled, once per
  move) or into a larger pool (a request longer than any before, without ``max_positions``).
* ``image``: image features written into a forward's input embeddings (LLaDA-V: a full-attention forward of a
  row's prompt columns, each feature written once where it goes, from the request's own copy).

The server reports them in ``/metrics`` (:func:`metric_rows`) and ``benchmarks/serve.py`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("kv_written", "kv_moved", "image")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class CopyCounter:
    """Bytes copied by kind (:data:`KINDS`): ``step`` in the step running or last run, ``total`` since the start;
    all kinds together, ``last_step`` in the last step finished and ``max_step`` the most any one step copied;
    ``steps`` the steps counted."""

    step: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    last_step: int = 0
    max_step: int = 0
    steps: int = 0

    def add(self, kind: str, count: int) -> None:
        self.step[kind] += count
        self.total[kind] += count

    def begin_step(self) -> None:
        self.step = dict.fromkeys(KINDS, 0)

    def end_step(self) -> None:
        self.steps += 1
        self.last_step = self.step_bytes()
        self.max_step = max(self.max_step, self.last_step)

    def step_bytes(self) -> int:
        """All kinds together, in the step running or last run."""
        return sum(self.step.values())


def metric_rows(counter: CopyCounter) -> list[tuple[str, str, str, int]]:
    """``(name, kind, help, value)`` of the server's ``/metrics`` lines for ``counter``."""
    t = counter.total
    return [
        ("engine_kv_bytes_written_total", "counter", "keys/values of the forwarded columns stored in the KV pool",
         t["kv_written"]),
        ("engine_kv_bytes_moved_total", "counter", "keys/values moved between slots or into a grown KV pool",
         t["kv_moved"]),
        ("engine_image_bytes_copied_total", "counter", "image features written into forwards' input embeddings",
         t["image"]),
        ("engine_step_bytes_copied_last", "gauge", "bytes the last engine step copied (keys/values and images)",
         counter.last_step),
        ("engine_step_bytes_copied_max", "gauge", "the most bytes one engine step copied since start",
         counter.max_step),
    ]
