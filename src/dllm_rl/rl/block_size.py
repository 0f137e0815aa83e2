"""Block-size adaptation (TraceRL, arXiv 2509.06949, its block-size enlargement experiment): a block model rolls
out at block ``B`` (``rollout.block_size``) and trains at block ``B' >= B`` (``train.block_size``).

The block is data, never a changed model attribute: the sampler decodes at ``DecodeConfig.block_size`` (the
rollout's block, recorded as ``Rollout.block_size``), and the trace planner, the two-stream layout and the
model's attention rule score at ``ScoringBatch.block_size`` (the training block).

A rollout decoded at block ``B`` is a valid trace at block ``B'`` when ``B'`` is a multiple of ``B``: each ``B'``
block holds whole ``B`` blocks decoded one after the other, so the state before each of its merged steps is a
state a block-``B'`` sampler can reach, and TraceRL's loss at ``B'`` teaches the model to decode at ``B'``.
"""

from __future__ import annotations

from typing import Any

from dllm_rl.config import ConfigError

__all__ = ["block_sizes", "run_block_sizes"]


def block_sizes(rollout_block: int | None, train_block: int | None, native: int | None) -> tuple[int | None, ...]:
    """``(rollout, train)`` block sizes of a model whose own block is ``native`` (``None``: full attention), from
    ``rollout.block_size`` and ``train.block_size`` (``None``: the model's block, the rollout's block). Raises
    :class:`ConfigError` naming the key when they do not fit."""
    if native is None:
        if rollout_block is not None or train_block is not None:
            raise ConfigError("rollout.block_size / train.block_size: for block models (SDAR) only; a full-attention "
                              "model decodes in rollout.block_length and trains on global decoding steps")
        return None, None
    rollout = rollout_block or native
    train = train_block or rollout
    for name, value in (("rollout.block_size", rollout), ("train.block_size", train)):
        if value < 1:
            raise ConfigError(f"{name}: must be >= 1, got {value}")
    if train < rollout or train % rollout:
        raise ConfigError(f"train.block_size: {train} must be a multiple of the rollout block ({rollout}) and at "
                          "least as large (a rollout at block B is a trace at block B' = k B)")
    return rollout, train


def run_block_sizes(cfg: Any, native: int | None) -> tuple[int | None, int | None, int | None]:
    """``(rollout, train, eval)`` block sizes of an RL run (``cfg``: an ``RLConfig``) on a model whose own block
    is ``native``; see :func:`block_sizes`. ``eval.block_size`` defaults to the rollout's block."""
    rollout, train = block_sizes(cfg.rollout.block_size, cfg.train.block_size, native)
    if cfg.eval.block_size is not None and rollout is None:
        raise ConfigError("eval.block_size: for block models (SDAR) only")
    return rollout, train, cfg.eval.block_size or rollout
