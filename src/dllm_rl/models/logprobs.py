"""Log-probabilities of chosen tokens without the ``[positions, vocab]`` logits: the LM head chunk by chunk.

Scoring a completion needs ``log p(token)`` at the scored positions only. At real vocabularies (126k for
LLaDA, 152k for Dream / SDAR / TraDo) the float32 logits of every scored position dominate activation
memory, so :func:`selected_logprobs` projects ``chunk_size`` positions at a time onto the vocabulary, takes
the float32 log-softmax of that chunk, keeps only the target's entry, and — under grad — recomputes the
chunk in backward (:func:`torch.utils.checkpoint.checkpoint`), so only one chunk's ``[chunk, V]`` logits
live at once in forward and in backward. ``-cross_entropy(logits, target, reduction="none")`` is exactly
``log_softmax(logits).gather(target)`` (PyTorch computes it as ``nll_loss(log_softmax(x))``).

:func:`head_selects` runs that projection inside the model's own forward: for one call the LM head returns
the selected log-probs instead of logits. Being inside the wrapped forward is what makes it correct under
every backend: FSDP2 and ZeRO-3 hold the head's full parameters only there (outside, they are shards), and
DDP / PEFT wrappers see the head used as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]  # the LM head module, or its forward

# Positions per chunk: at a 152k vocabulary one chunk's float32 logits are 78 MB (128 x 151,936 x 4 bytes),
# and a projection of 128 positions still keeps an accelerator's matrix units busy.
DEFAULT_CHUNK_SIZE = 128


def check_chunk_size(chunk_size: int, key: str = "logprob_chunk_size") -> int:
    """``chunk_size`` as an int >= 0 (0 = no chunking); ``ValueError`` naming ``key`` otherwise."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 0:
        raise ValueError(f"{key} must be an int >= 0 (positions per LM-head chunk; 0 = off), got {chunk_size!r}")
    return chunk_size


def _chunk_logp(head: Head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -F.cross_entropy(head(hidden).float(), targets, reduction="none")


def selected_logprobs(
    hidden: torch.Tensor, head: Head, targets: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """``log softmax(head(hidden))[n, targets[n]]`` in float32, ``[N]``, from hidden states ``[N, H]``.

    ``head`` is the LM head (a module, or its forward; called on ``[chunk, H]`` slices, so LoRA wrappers of it
    apply); ``chunk_size`` positions are projected at a time (0: all at once). Under grad each
    chunk is recomputed in backward instead of keeping its logits, so the memory beyond the inputs is one
    chunk's ``[chunk, V]`` logits and their gradient, whatever ``N``.
    """
    check_chunk_size(chunk_size, "chunk_size")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"selected_logprobs: hidden must be [N, H] and targets [N], got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    n = hidden.shape[0]
    step = chunk_size or max(n, 1)
    recompute = torch.is_grad_enabled() and chunk_size > 0
    parts = []
    for start in range(0, n, step):
        h, t = hidden[start : start + step], targets[start : start + step]
        if recompute:
            parts.append(checkpoint(_chunk_logp, head, h, t, use_reentrant=False))
        else:
            parts.append(_chunk_logp(head, h, t))
    if not parts:
        return hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat(parts)


@contextmanager
def head_selects(
    head: nn.Module, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor, chunk_size: int
) -> Iterator[None]:
    """Within the block, ``head(hidden)`` (``hidden`` ``[B, T, H]``, as a causal LM's forward calls its LM head)
    returns :func:`selected_logprobs` of ``hidden[rows, cols]`` for ``targets``, ``[N]`` float32, instead of
    ``[B, T, V]`` logits.

    The module's hooks run once around the call, as for any forward (FSDP2 / ZeRO-3 gather the head's
    parameters there); the chunks call the head's own forward, so its parameters are read in full, and the
    recomputation in backward runs while they still are. A forward set on the instance is restored after.
    """
    own = head.__dict__.get("forward")
    original = head.forward

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return selected_logprobs(hidden[rows, cols], original, targets, chunk_size)

    head.forward = forward
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
