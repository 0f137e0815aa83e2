"""Log-probabilities of committed tokens, recorded by the engine for the requests that ask (``dllm-rl serve``'s
``logprobs`` / ``top_logprobs``).

A masked diffusion model has no left-to-right likelihood to report: a token is committed at one denoising step,
from that step's distribution over the vocabulary at its slot, given the prompt and the tokens committed before.
:func:`step_logprobs` gives that distribution's log-probability of the committed token (and the ``top`` most likely
alternatives) for a step's rows: the distribution the token was drawn from, ``log_softmax(filter(logits / T))``
with the request's temperature ``T`` and its top-k / top-p filter (:func:`~dllm_rl.sampling.confidence.filter_logits`),
or the model's own ``log_softmax(logits)`` at temperature 0 (greedy takes its argmax). vLLM's
``logprobs_mode="processed_logprobs"`` reports the same for an autoregressive model.

:class:`LogprobMaps` keeps, per canvas column of one sequence, the values of the step that last committed the
column (a token RCR re-masks and commits again takes its new step's), on the device: only the committed slots'
values (``[width]`` and ``[width, top]``), never a step's ``[block, vocab]`` distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_rl.sampling.confidence import filter_logits

MAX_TOP = 20  # the most alternatives a request may ask for (OpenAI's top_logprobs limit)


def step_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int, top_p: float,
                  top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprob [n, L], top values [n, L, top], top ids [n, L, top])`` of ``tokens`` under each row's step
    distribution (see the module docstring), from logits ``[n, L, V]``, in float64 one row at a time (one
    ``[L, V]`` copy). Alternatives outside the filtered support hold ``-inf``."""
    lp, vals, ids = [], [], []
    for row, tok in zip(logits, tokens):
        x = row.double()
        if temperature > 0:
            x = filter_logits(x / temperature, top_k, top_p)
        x = torch.log_softmax(x, dim=-1)
        lp.append(x.gather(-1, tok[:, None])[:, 0])
        v, i = torch.topk(x, min(top, x.shape[-1]), dim=-1)
        vals.append(v)
        ids.append(i)
    if not lp:
        return (logits.new_zeros(tokens.shape, dtype=torch.float64), logits.new_zeros((*tokens.shape, top)),
                tokens.new_zeros((*tokens.shape, top)))
    return torch.stack(lp), torch.stack(vals), torch.stack(ids)


@dataclass
class TokenLogprobs:
    """One completion's recorded values, on the host: per completion slot its token, that token's log-probability
    at the step that committed it (None where it was never committed by a step: prefilled or EOS-filled) and the
    ``top`` alternatives ``(token, log-probability)``, most likely first (finite ones only)."""

    tokens: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[int, float]]]


class LogprobMaps:
    """One sequence's per-column log-probabilities at commit (see the module docstring)."""

    def __init__(self, width: int, top: int, device):
        self.top = top
        self.value = torch.zeros(width, dtype=torch.float32, device=device)
        self.top_value = torch.full((width, top), float("-inf"), dtype=torch.float32, device=device)
        self.top_id = torch.zeros((width, top), dtype=torch.long, device=device)

    def write(self, start: int, committed: torch.Tensor, lp: torch.Tensor, top_value: torch.Tensor,
              top_id: torch.Tensor) -> None:
        """The columns ``start + j`` with ``committed[j]`` take this step's values (``[L]``, ``[L, >= top]``)."""
        end = start + committed.shape[0]
        self.value[start:end] = torch.where(committed, lp.float(), self.value[start:end])
        keep = committed[:, None]
        self.top_value[start:end] = torch.where(keep, top_value[:, : self.top].float(), self.top_value[start:end])
        self.top_id[start:end] = torch.where(keep, top_id[:, : self.top], self.top_id[start:end])

    def read(self, x: torch.Tensor, step_map: torch.Tensor, c0: int, c1: int) -> TokenLogprobs:
        """The completion columns ``[c0, c1)`` of a row whose tokens are ``x`` and trace ``step_map`` (``[width]``),
        read from the device at once."""
        tokens, steps, value = x[c0:c1].tolist(), step_map[c0:c1].tolist(), self.value[c0:c1].tolist()
        top_value, top_id = self.top_value[c0:c1].tolist(), self.top_id[c0:c1].tolist()
        return TokenLogprobs(tokens, [v if s >= 0 else None for v, s in zip(value, steps)],
                             [[(i, v) for i, v in zip(ids, vals) if v != float("-inf")] if s >= 0 else []
                              for ids, vals, s in zip(top_id, top_value, steps)])
