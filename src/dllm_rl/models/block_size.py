"""A block model decoding (or scored) at another block size for the span of a ``with``: every block-model code
path reads the model's ``block_size`` (TraceRL's block-size adaptation, :mod:`dllm_rl.rl.block_size`; ``dllm-rl
eval --block-size``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from dllm_rl.models.diffusion_lm import DiffusionLM


@contextlib.contextmanager
def block_size_as(models: Iterable[DiffusionLM | None], size: int | None) -> Iterator[None]:
    """Within the ``with``, the block models among ``models`` use block ``size`` (``None``: unchanged)."""
    targets = [m for m in models if m is not None and m.is_block_causal and size is not None]
    before = [m.block_size for m in targets]
    for m in targets:
        m.block_size = int(size)
    try:
        yield
    finally:
        for m, b in zip(targets, before):
            m.block_size = b
