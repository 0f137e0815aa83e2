"""Advantage estimators: one function per rule, registered by name (verl's ``core_algos`` style).

Every rule has one signature, ``(rewards, group_size, scale_rewards, **options) -> advantages``: rewards ``[N]``
ordered group by group (``rollout.num_generations`` consecutive samples per prompt) in, advantages ``[N]``
(float32) out; a rule's keyword options come from the config's ``advantage_options``. :data:`ADVANTAGES` is the
table of names. :func:`group_filter` decides which groups enter the update.
"""

from __future__ import annotations

import inspect
import math
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


def pass_at_k(rewards: torch.Tensor, group_size: int, scale_rewards: str = "none", k: int = 4) -> torch.Tensor:
    """Pass@k training's advantage (Chen et al. 2025, arXiv 2508.10751, section 4's analytical form; for rewards
    that are not 0/1, the max over a subset as in Walder and Karkhanis 2025, arXiv 2505.15201): every size-``k``
    subset of a group is scored by its best reward, and a sample's advantage is the mean score of the subsets
    holding it less the mean over all subsets, ``A_i = E[max | i in S] - E[max]``. A right answer in a group with
    few others gains a lot, one among many right ones little, and a wrong one loses only as often as the subsets
    it sits in hold no right answer: the update leans to the prompts the policy rarely solves and keeps a group's
    other answers. ``k = 1`` is GRPO's ``r - mean``. ``scale_rewards``: ``group`` divides by the subset scores'
    standard deviation (the paper's ``sigma``), ``batch`` by the batch's reward standard deviation, ``none``
    (ESPO's, the default) not at all.

    Closed form, computed exactly (no sampling of subsets): with a group's rewards sorted ascending, ``r_1 <= ...
    <= r_G``, ``E[max] = sum_j r_j C(j-1, k-1) / C(G, k)`` and, for the sample at rank ``i``, ``E[max | i in S] =
    (r_i C(i-1, k-1) + sum_{j>i} r_j C(j-2, k-2)) / C(G-1, k-1)`` (ties give the same values in any order)."""
    if not 1 <= k <= group_size:
        raise ValueError(f"advantage_options: k must be in [1, rollout.num_generations = {group_size}], got {k}")
    g = _groups(rewards, group_size).double()
    r, order = g.sort(dim=1)
    comb = lambda n, m: math.comb(n, m) if n >= 0 and m >= 0 else 0  # noqa: E731
    rank = range(1, group_size + 1)
    w_all = g.new_tensor([comb(j - 1, k - 1) / comb(group_size, k) for j in rank])
    w_self = g.new_tensor([comb(i - 1, k - 1) / comb(group_size - 1, k - 1) for i in rank])
    w_above = g.new_tensor([comb(j - 2, k - 2) / comb(group_size - 1, k - 1) for j in rank])
    mean = (r * w_all).sum(dim=1, keepdim=True)
    above = (r * w_above).flip(1).cumsum(1).flip(1)  # sum over ranks >= j
    above = torch.cat([above[:, 1:], above.new_zeros((len(r), 1))], dim=1)  # sum over ranks > i
    adv = torch.empty_like(r).scatter_(1, order, r * w_self + above - mean)
    if scale_rewards == "group":
        std = ((r.square() * w_all).sum(dim=1, keepdim=True) - mean.square()).clamp(min=0).sqrt()
        return (adv / (std + EPS)).float().reshape(-1)
    return _scale(adv, g, scale_rewards).float().reshape(-1)


def raft(rewards: torch.Tensor, group_size: int, scale_rewards: str = "none", min_reward: float = 1.0) -> torch.Tensor:
    """RAFT's weights (reward-ranked fine-tuning, Dong et al. 2023, arXiv 2304.06767, as Xiong et al. 2025, arXiv
    2504.11343, run it for verifiable rewards): of each prompt's samples, train on the accepted ones only, each with
    weight 1, i.e. ``A_i = 1`` where ``r_i >= min_reward`` (1: a right answer under a 0/1 reward) and 0 elsewhere.
    No baseline and no scaling (``scale_rewards`` is not read): the update never pushes a sample down, which the
    second paper finds competitive with GRPO (its gains coming from dropping all-wrong groups, not from the wrong
    answers' negative weights). Checked against the papers' abstracts and summaries, not their equations."""
    g = _groups(rewards, group_size)
    return (g >= min_reward).float().reshape(-1)


# RAFT selects rather than weighs: a sample it gives 0 leaves the update (collect.py), so the loss is the mean over
# the accepted samples alone, RAFT's fine-tuning on them, not that mean shrunk by the share of wrong answers kept
# beside them in the groups with signal.
raft.selects = "a sample whose reward is >= min_reward"  # what it accepts, as a skipped step's message says


AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGES: dict[str, AdvantageFn] = {
    "group_zscore": group_zscore,
    "leave_one_out": leave_one_out,
    "pass_at_k": pass_at_k,
    "raft": raft,
}


#: ``@register_advantage("name")``: register ``fn`` as advantage rule ``name`` in :data:`ADVANTAGES`.
register_advantage = registrar(ADVANTAGES, "advantage")


def compute_advantages(name: str, rewards: torch.Tensor, group_size: int, scale_rewards: str,
                       options: dict | None = None) -> torch.Tensor:
    """Advantage rule ``name`` (see :data:`ADVANTAGES`) of ``rewards`` in groups of ``group_size``, with its keyword
    ``options`` (``advantage_options``)."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage {name!r}; choose one of {', '.join(ADVANTAGES)}")
    fn, options = ADVANTAGES[name], dict(options or {})
    params = list(inspect.signature(fn).parameters.values())[3:]
    valid = [p.name for p in params]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"advantage_options: {', '.join(unknown)} not read by the {name!r} advantage; valid: "
                         f"{', '.join(valid) or '(none)'}")
    for p in params:
        if p.name in options:
            _check_option_type(p.name, options[p.name], p.default)
    return fn(rewards, group_size, scale_rewards, **options)


def _check_option_type(key: str, value: object, default: object) -> None:
    """``ValueError`` naming ``advantage_options.key`` when ``value`` is not of its default's kind: an integer
    option takes an integer, a real one a finite number (bools, strings, lists and null are neither); a rule
    checks the range itself."""
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int) and not (number and isinstance(value, int)):
        raise ValueError(f"advantage_options: {key} must be an integer, got {value!r}")
    if not number or not math.isfinite(value):
        raise ValueError(f"advantage_options: {key} must be a finite number, got {value!r}")


def decoupled_advantages(name: str, values: torch.Tensor, weights: list[float], group_size: int, scale_rewards: str,
                         options: dict | None = None) -> torch.Tensor:
    """LightningRL's per-reward decoupled normalisation (Hu et al., arXiv 2603.13319, Sec. 3.1): each reward term's
    values ``values[:, k]`` (``[N, K]``, group by group) normalised within the group on their own by advantage rule
    ``name`` (Eq. 5: ``R_k = (r_k - mean_g r_k) / (std_g r_k + eps)`` under ``group_zscore`` with ``scale_rewards``
    ``group``), summed with the terms' ``weights`` (Eq. 6, where the paper's weights are 1), and the sum normalised
    over the batch, ``(A - mean_B A) / (std_B A + eps)`` (Eq. 7), so that the update's scale does not grow with the
    number of terms. A term with the same value across a group adds nothing to that group's advantages; a group
    whose every term is flat has advantage 0 before Eq. 7. (Equation numbers of the paper's v1, not verified: see
    :mod:`dllm_rl.rewards.speed`.)"""
    values = values.float()
    if values.dim() != 2 or values.shape[1] != len(weights):
        raise ValueError(f"decoupled_advantages: values of shape {tuple(values.shape)} for {len(weights)} weights")
    total = torch.zeros(values.shape[0])
    for k, w in enumerate(weights):
        total += w * compute_advantages(name, values[:, k], group_size, scale_rewards, options)
    std = total.std() if total.numel() > 1 else torch.tensor(0.0)
    return (total - total.mean()) / (std + EPS)


@dataclass
class GroupFilter:
    """Which samples enter the update, and why the others did not."""

    keep: torch.Tensor  # [N] bool
    zero_variance_groups: int
    out_of_band_groups: int
    narrow_tpf_groups: int = 0  # groups that tpf_spread dropped (and no rule before it)


def group_filter(
    rewards: torch.Tensor,
    group_size: int,
    drop_zero_variance: bool = True,
    accuracy_band: tuple[float, float] | None = None,
    correct: torch.Tensor | None = None,
    tpf: torch.Tensor | None = None,
    tpf_spread: float | None = None,
) -> GroupFilter:
    """Drop groups whose rewards are all equal (no learning signal) and, optionally, groups whose
    accuracy lies outside ``accuracy_band`` (TraceRL keeps 0.2 <= acc <= 0.8) and groups that LightningRL's
    TPF-aware filter drops (``tpf_spread``: keep a group only when ``max_j tpf - min_j tpf >= tpf_spread``, arXiv
    2603.13319 Eq. 11 of v1, not verified, and at least one answer is right; ``tpf`` ``[N]``, each sample's tokens
    per forward). ``correct`` (bool ``[N]``) defaults to ``reward >= 1``."""
    g = _groups(rewards, group_size)
    correct = correct if correct is not None else rewards >= 1.0 - 1e-9
    zero_var = (g.max(dim=1).values - g.min(dim=1).values) <= 1e-12
    keep_group = ~zero_var if drop_zero_variance else torch.ones_like(zero_var)
    out_band = torch.zeros_like(zero_var)
    if accuracy_band is not None:
        lo, hi = accuracy_band
        ok = correct.float().view(-1, group_size).mean(1)
        out_band = (ok < lo - 1e-9) | (ok > hi + 1e-9)
        keep_group &= ~out_band
    narrow = torch.zeros_like(zero_var)
    if tpf_spread is not None:
        if tpf is None:
            raise ValueError("group_filter: tpf_spread needs each sample's tokens per forward (tpf)")
        t = _groups(tpf, group_size)
        right = correct.view(-1, group_size).any(1)
        narrow = ((t.max(dim=1).values - t.min(dim=1).values) < tpf_spread - 1e-9) | ~right
        before = keep_group.clone()
        keep_group &= ~narrow
        narrow &= before
    return GroupFilter(
        keep=keep_group.repeat_interleave(group_size),
        zero_variance_groups=int(zero_var.sum()),
        out_of_band_groups=int((out_band & ~(zero_var & drop_zero_variance)).sum()),
        narrow_tpf_groups=int(narrow.sum()),
    )
