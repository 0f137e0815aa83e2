"""Log-probabilities of chosen tokens without the ``[positions, vocab]`` logits: the LM head chunk by chunk.

Scoring a completion needs ``log p(token)`` at the scored positions only. At real vocabularies (126k for
LLaDA, 152k for Dream / SDAR / TraDo) the float32 logits of every scored position dominate activation
memory, so :func:`selected_logprobs` projects ``chunk_size`` positions at a time onto the vocabulary, takes
the float32 log-softmax of that chunk, keeps only the target's entry, and — under grad — recomputes the
chunk in backward (:func:`torch.utils.checkpoint.checkpoint`), so only one chunk's ``[chunk, V]`` logits
live at once in forward and in backward. ``-cross_entropy(logits, target, reduction="none")`` is exactly
``log_softmax(logits).gather(target)`` (PyTorch computes it as ``nll_loss(log_softmax(x))``).

A plain ``nn.Linear`` head (every family's, also under FSDP2 / ZeRO-3 / DDP) goes through
:class:`_LinearSelected`, whose backward sums the head's weight gradient chunk by chunk into one ``[V, H]``
buffer (``addmm_``) and reuses one ``[chunk, V]`` buffer for the recomputed logits, the softmax and their
gradient. Checkpointing each chunk instead lets autograd make a ``[V, H]`` gradient per chunk beside the
running sum, and three ``[chunk, V]`` tensors (logits, log-softmax, gradient): measured in
``benchmarks/memory.py``, that is ~4 x 74 MiB at a 152k vocabulary and hidden 128. Any other head (a LoRA
wrapper of it, a custom module) keeps the checkpointed path, which calls it as a black box. Written by hand
because no kernel in the libraries we use does this on CPU and GPU alike (fused linear cross-entropy
kernels are CUDA-only and return a mean loss, not per-position log-probs with upstream gradients).

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


def _plain_linear(head: Head) -> nn.Linear | None:
    """``head`` when it computes exactly ``F.linear(x, head.weight, head.bias)``: an ``nn.Linear`` (or a
    subclass FSDP2 makes of it) whose forward is Linear's own; ``None`` for anything else (a PEFT LoRA
    wrapper, a forward set on the instance, a bare callable)."""
    if (isinstance(head, nn.Linear) and type(head).forward is nn.Linear.forward
            and "forward" not in head.__dict__):
        return head
    return None


class _LinearSelected(torch.autograd.Function):
    """``log softmax(F.linear(hidden, weight, bias))[n, targets[n]]`` chunk by chunk, backward by hand.

    Forward keeps only each position's log-sum-exp (``[N]``); backward recomputes one chunk's logits at a time
    into one buffer, turns it in place into ``g * (onehot(target) - softmax)`` (the gradient of
    ``g * log_softmax[target]``), and adds its products into ``grad_hidden`` and one ``grad_weight``.
    Under autocast the logits are computed in the dtype forward saw (recorded), so backward's recomputation
    matches forward's.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, step):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        compute_dtype = hidden.dtype
        for start in range(0, hidden.shape[0], step):
            sl = slice(start, start + step)
            raw = F.linear(hidden[sl], weight, bias)
            compute_dtype = raw.dtype
            logits = raw.float()
            out[sl] = -F.cross_entropy(logits, targets[sl], reduction="none")  # the checkpointed path's numbers
            lse[sl] = torch.logsumexp(logits, -1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.step, ctx.compute_dtype = step, compute_dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt = ctx.compute_dtype
        w = weight.to(cdt)  # no copy unless autocast ran forward in another dtype
        b = None if bias is None else bias.to(cdt)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        with torch.no_grad():
            for start in range(0, hidden.shape[0], ctx.step):
                sl = slice(start, start + ctx.step)
                h, g = hidden[sl].to(cdt), grad_out[sl].float()
                d = F.linear(h, w, b).float()
                d.sub_(lse[sl, None]).exp_().mul_(-g[:, None])  # -g * softmax
                d.scatter_add_(1, targets[sl, None], g[:, None])  # + g at the target
                if need_h:
                    grad_h[sl] = (d.to(cdt) @ w).to(hidden.dtype)
                if need_w:
                    grad_w.addmm_(d.t().to(weight.dtype), h.to(weight.dtype))
                if need_b:
                    grad_b.add_(d.sum(0).to(bias.dtype))
                del d  # before the next chunk's logits exist
        return grad_h, grad_w, grad_b, None, None


def selected_logprobs(
    hidden: torch.Tensor, head: Head, targets: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE,
    linear: nn.Linear | None = None,
) -> torch.Tensor:
    """``log softmax(head(hidden))[n, targets[n]]`` in float32, ``[N]``, from hidden states ``[N, H]``.

    ``head`` is the LM head (a module, or its forward; called on ``[chunk, H]`` slices, so LoRA wrappers of it
    apply); ``chunk_size`` positions are projected at a time (0: all at once). Under grad each
    chunk is recomputed in backward instead of keeping its logits, so the memory beyond the inputs is one
    chunk's ``[chunk, V]`` logits and their gradient, whatever ``N``. A plain ``nn.Linear`` head (or
    ``linear``, the module whose own forward ``head`` is) goes through :class:`_LinearSelected`.
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
    linear = linear if linear is not None else _plain_linear(head)
    if linear is not None and n and torch.is_grad_enabled():
        return _LinearSelected.apply(hidden, linear.weight, linear.bias, targets, step)
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


def selected_entropy(hidden: torch.Tensor, head: Head, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """The Shannon entropy (nats, float32, ``[N]``) of ``softmax(head(hidden))`` over the whole vocabulary, from
    hidden states ``[N, H]``, ``chunk_size`` positions at a time (0: all at once), so at most one chunk's
    ``[chunk, V]`` logits exist. No gradient (IGPO ranks tokens by it, :mod:`dllm_rl.rl.inpaint_filter`)."""
    check_chunk_size(chunk_size, "chunk_size")
    step = chunk_size or max(hidden.shape[0], 1)
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    with torch.no_grad():
        for start in range(0, hidden.shape[0], step):
            logp = torch.log_softmax(head(hidden[start : start + step]).float(), dim=-1)
            out[start : start + step] = -(logp.exp() * logp).sum(-1)
    return out


@contextmanager
def head_selects(
    head: nn.Module, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor | None, chunk_size: int
) -> Iterator[None]:
    """Within the block, ``head(hidden)`` (``hidden`` ``[B, T, H]``, as a causal LM's forward calls its LM head)
    returns :func:`selected_logprobs` of ``hidden[rows, cols]`` for ``targets``, ``[N]`` float32, instead of
    ``[B, T, V]`` logits (``targets=None``: their :func:`selected_entropy`).

    The module's hooks run once around the call, as for any forward (FSDP2 / ZeRO-3 gather the head's
    parameters there); the chunks call the head's own forward, so its parameters are read in full, and the
    recomputation in backward runs while they still are. A forward set on the instance is restored after.
    """
    own = head.__dict__.get("forward")
    original = head.forward
    linear = _plain_linear(head)  # read before the instance's forward is replaced below

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if targets is None:
            return selected_entropy(hidden[rows, cols], original, chunk_size)
        return selected_logprobs(hidden[rows, cols], original, targets, chunk_size, linear=linear)

    head.forward = forward
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
