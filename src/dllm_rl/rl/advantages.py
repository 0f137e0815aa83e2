"""Advantage estimators: one function per rule, registered by name (verl's ``core_algos`` style).

Every rule has one signature, ``(rewards, group_size, scale_rewards) -> advantages``: rewards ``[N]`` ordered
group by group (``rollout.num_generations`` consecutive samples per prompt) in, advantages ``[N]`` (float32) out;
:data:`ADVANTAGES` is the table of names. :func:`group_filter` decides which groups enter the update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_rl.registry import registrar

EPS = 1e-4


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.float().view(-1, group_size)


def _scale(values: torch.Tensor, groups: torch.Tensor, scale_rewards: str) -> torch.Tensor:
    """Divide ``values`` (``[N/G, G]``) by the group's (``group``) or the batch's (``batch``) reward standard
    deviation (unbiased, as in TRL) plus :data:`EPS`, or not at all (``none``, Dr. GRPO arXiv 2503.20783)."""
    if scale_rewards == "group":
        std = groups.std(dim=1, keepdim=True) if groups.shape[1] > 1 else torch.zeros_like(groups[:, :1])
        return values / (std + EPS)
    if scale_rewards == "batch":
        std = groups.std() if groups.numel() > 1 else torch.tensor(0.0)
        return values / (std + EPS)
    if scale_rewards != "none":
        raise ValueError(f"scale_rewards must be group, batch or none; got {scale_rewards!r}")
    return values


def group_zscore(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """GRPO advantage (DeepSeekMath, arXiv 2402.03300, section 4.1.2 outcome supervision, as used in Eq. 3):
    ``(r - mean_g) / std``.

    ``scale_rewards`` (TRL's name): ``group`` divides by the group's standard deviation (unbiased, as in
    TRL), ``batch`` by the whole batch's, ``none`` does not scale (Dr. GRPO, arXiv 2503.20783).
    """
    g = _groups(rewards, group_size)
    return _scale(g - g.mean(dim=1, keepdim=True), g, scale_rewards).reshape(-1)


def leave_one_out(rewards: torch.Tensor, group_size: int, scale_rewards: str = "none") -> torch.Tensor:
    """RLOO baseline (Ahmadian et al., arXiv 2402.14740, eq. 4): ``r_i - mean_{j != i} r_j``.

    ESPO's default advantage. Equals ``G/(G-1) * (r_i - mean_g)``; ``scale_rewards`` as in
    :func:`group_zscore` optionally divides by the group or batch standard deviation.
    """
    if group_size < 2:
        raise ValueError("leave_one_out needs rollout.num_generations >= 2")
    g = _groups(rewards, group_size)
    loo = g - (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return _scale(loo, g, scale_rewards).reshape(-1)


AdvantageFn = Callable[[torch.Tensor, int, str], torch.Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {
    "group_zscore": group_zscore,
    "leave_one_out": leave_one_out,
}


#: ``@register_advantage("name")``: register ``fn`` as advantage rule ``name`` in :data:`ADVANTAGES`.
register_advantage = registrar(ADVANTAGES, "advantage")


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """Advantage rule ``name`` (see :data:`ADVANTAGES`) of ``rewards`` in groups of ``group_size``."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage {name!r}; choose one of {', '.join(ADVANTAGES)}")
    return ADVANTAGES[name](rewards, group_size, scale_rewards)


@dataclass
class GroupFilter:
    """Which samples enter the update, and why the others did not."""

    keep: torch.Tensor  # [N] bool
    zero_variance_groups: int
    out_of_band_groups: int


def group_filter(
    rewards: torch.Tensor,
    group_size: int,
    drop_zero_variance: bool = True,
    accuracy_band: tuple[float, float] | None = None,
    correct: torch.Tensor | None = None,
) -> GroupFilter:
    """Drop groups whose rewards are all equal (no learning signal) and, optionally, groups whose
    accuracy lies outside ``accuracy_band`` (TraceRL keeps 0.2 <= acc <= 0.8). ``correct`` (bool ``[N]``)
    defaults to ``reward >= 1``."""
    g = _groups(rewards, group_size)
    zero_var = (g.max(dim=1).values - g.min(dim=1).values) <= 1e-12
    keep_group = ~zero_var if drop_zero_variance else torch.ones_like(zero_var)
    out_band = torch.zeros_like(zero_var)
    if accuracy_band is not None:
        lo, hi = accuracy_band
        ok = (correct if correct is not None else rewards >= 1.0 - 1e-9).float().view(-1, group_size).mean(1)
        out_band = (ok < lo - 1e-9) | (ok > hi + 1e-9)
        keep_group &= ~out_band
    return GroupFilter(
        keep=keep_group.repeat_interleave(group_size),
        zero_variance_groups=int(zero_var.sum()),
        out_of_band_groups=int((out_band & ~(zero_var & drop_zero_variance)).sum()),
    )
