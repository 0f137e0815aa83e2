"""Is this token an end of sequence: the one test every sampler, completion mask and stream makes.

A checkpoint may name several EOS ids (config.json's ``eos_token_id`` as a list, generation_config.json's list:
end of turn and end of text; :attr:`~dllm_rl.models.DiffusionLM.eos_token_ids`). A row ends at the first token
that is any of them, as the stock ``generate(eos_token_id=[...])`` ends it; the first id stays the one a caller
appends or fills with. ``ids`` is an id or a tuple of ids everywhere here.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def as_ids(ids: int | Iterable[int]) -> tuple[int, ...]:
    """``ids`` (an id or several) as a tuple of ints."""
    return (int(ids),) if isinstance(ids, int) else tuple(int(i) for i in ids)


def eos_mask(tokens: torch.Tensor, ids: int | Iterable[int]) -> torch.Tensor:
    """``tokens`` (any shape) as a bool tensor: True where the token is one of the EOS ``ids``. Compared with each id
    as a Python scalar (a handful of them), so no id tensor is built or copied to the device per call."""
    first, *rest = as_ids(ids)
    out = tokens == first
    for i in rest:
        out |= tokens == i
    return out


def first_eos(tokens: list[int], ids: int | Iterable[int]) -> int | None:
    """The index of the first EOS (any of ``ids``) in a host list of token ids, or None."""
    ends = set(as_ids(ids))
    return next((k for k, t in enumerate(tokens) if t in ends), None)
