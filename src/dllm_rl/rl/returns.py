"""Step returns and token advantages of TraceRL's diffusion value model (arXiv 2509.06949, its section on the
diffusion-based value model), and the clipped value loss. Pure tensor code, no model.

A completion's decoding trace is a sequence of (merged) steps ``t = 0 .. S-1``; ``rank[b, g]`` is the step of
completion token ``g`` (-1 for tokens that do not count). Values come per token (``V_j``: the value read at the
state in which token ``j`` was committed); rewards come per step (the outcome reward on the last step, or
process rewards on given steps). With ``r*_t`` the reward and ``V*_t`` the mean token value of step ``t``:

* step return ``R*_t = r*_t + gamma R*_{t+1}`` (``R*_S = 0``);
* step TD residual ``delta_t = r*_t - V*_t + gamma V*_{t+1}`` and GAE ``A*_t = delta_t + gamma lam A*_{t+1}``
  (Schulman et al., arXiv 1506.02438, Eq. 10 and Eq. 16, over the trace's steps);
* token return ``R_j = R*_t`` and token advantage ``A_j = r*_t - V_j + gamma V*_{t+1} + gamma lam A*_{t+1}``
  (GAE with the token's own value as the baseline of its step), for token ``j`` of step ``t``.

With ``gamma = lam = 1`` this is ``A_j = R_j - V_j``. The numbering of the TraceRL paper's own equations could
not be checked here, so the docstrings cite the GAE paper for the recursions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def step_ranks(key: torch.Tensor, counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rank [B, G], num_steps [B])``: each counted token's step index, numbering each row's distinct ``key``
    values (its decoding-order step ids) ``0 .. S_b - 1`` in increasing order; -1 where not ``counted``."""
    rank = torch.full_like(key, -1, dtype=torch.long)
    num = torch.zeros(key.shape[0], dtype=torch.long, device=key.device)
    for b in range(key.shape[0]):
        sel = counted[b]
        if not bool(sel.any()):
            continue
        uniq = torch.unique(key[b][sel])  # sorted
        rank[b][sel] = torch.searchsorted(uniq, key[b][sel])
        num[b] = uniq.numel()
    return rank, num


def step_means(token_values: torch.Tensor, rank: torch.Tensor, num_steps: int) -> torch.Tensor:
    """``[B, S]``: the mean of ``token_values`` over the tokens of each step (``V*_t``); 0 for empty steps."""
    b_n = token_values.shape[0]
    sums = torch.zeros(b_n, num_steps + 1, dtype=torch.float32, device=token_values.device)
    counts = torch.zeros_like(sums)
    slot = torch.where(rank >= 0, rank, num_steps)  # uncounted tokens go to a spare column
    sums.scatter_add_(1, slot, token_values.float())
    counts.scatter_add_(1, slot, torch.ones_like(token_values, dtype=torch.float32))
    return (sums / counts.clamp(min=1.0))[:, :num_steps]


def outcome_step_rewards(rewards: torch.Tensor, num_steps: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, S]``: each sample's outcome reward on its last step ``S_b - 1`` (nothing for a sample with no step)."""
    out = torch.zeros(rewards.shape[0], width, dtype=torch.float32, device=rewards.device)
    has = num_steps > 0
    rows = torch.nonzero(has, as_tuple=True)[0]
    out[rows, num_steps[rows] - 1] = rewards.float()[rows]
    return out


def process_step_rewards(scores: Sequence[Sequence[float] | None], raw_rank: torch.Tensor,
                         rank: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, S]``: process rewards aligned to the merged steps.

    ``scores[b]`` lists sample ``b``'s reward per *decoding step* of its rollout, in decoding order (score ``k``
    for the ``k``-th distinct step at which its counted tokens were committed; ``raw_rank`` numbers them); a
    shorter list leaves the remaining steps at 0. A merged step (``rank``; shrinkage merges consecutive
    decoding steps) gets the sum of its decoding steps' scores. ``None`` = no process scores for that sample.
    """
    out = torch.zeros(raw_rank.shape[0], width, dtype=torch.float32)
    for b, row in enumerate(scores):
        if row is None:
            continue
        sel = raw_rank[b] >= 0
        raw_steps = int(raw_rank[b][sel].max().item()) + 1 if bool(sel.any()) else 0
        if len(row) > raw_steps:
            raise ValueError(f"sample {b}: the reward gave {len(row)} per-step scores for a rollout of {raw_steps} "
                             "decoding steps; give at most one score per decoding step")
        merged_of = torch.zeros(max(raw_steps, 1), dtype=torch.long)
        merged_of[raw_rank[b][sel].cpu()] = rank[b][sel].cpu()
        for k, v in enumerate(row):
            out[b, merged_of[k]] += float(v)
    return out.to(raw_rank.device)


def _next(x: torch.Tensor) -> torch.Tensor:
    """``x[:, t + 1]`` with 0 past the end."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


def step_returns(step_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """``[B, S]``: ``R*_t = r*_t + gamma R*_{t+1}`` (the discounted return, arXiv 1506.02438 Sec. 2), 0 past a
    row's last step (its rewards there are 0)."""
    out = torch.zeros_like(step_rewards)
    acc = torch.zeros_like(step_rewards[:, 0])
    for t in range(step_rewards.shape[1] - 1, -1, -1):
        acc = step_rewards[:, t] + gamma * acc
        out[:, t] = acc
    return out


def step_advantages(step_rewards: torch.Tensor, step_values: torch.Tensor, num_steps: torch.Tensor,
                    gamma: float, lam: float) -> torch.Tensor:
    """``[B, S]``: GAE over steps, ``A*_t = delta_t + gamma lam A*_{t+1}`` with
    ``delta_t = r*_t - V*_t + gamma V*_{t+1}`` (arXiv 1506.02438 Eq. 10 and Eq. 16); 0 past a row's last step."""
    alive = torch.arange(step_rewards.shape[1], device=step_rewards.device)[None, :] < num_steps[:, None]
    v = torch.where(alive, step_values, 0.0)
    delta = torch.where(alive, step_rewards - v + gamma * _next(v), 0.0)
    out = torch.zeros_like(delta)
    acc = torch.zeros_like(delta[:, 0])
    for t in range(delta.shape[1] - 1, -1, -1):
        acc = delta[:, t] + gamma * lam * acc
        out[:, t] = acc
    return out


def _at(step_tensor: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """``step_tensor[b, rank[b, g]]`` per token, 0 where ``rank`` is -1."""
    return torch.where(rank >= 0, step_tensor.gather(1, rank.clamp(min=0)), 0.0)


def token_returns_advantages(token_values: torch.Tensor, rank: torch.Tensor, num_steps: torch.Tensor,
                             step_rewards: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(returns, advantages)``, both ``[B, G]`` (0 for uncounted tokens): ``R_j = R*_t`` and
    ``A_j = r*_t - V_j + gamma V*_{t+1} + gamma lam A*_{t+1}`` for token ``j`` of step ``t``, where ``V*`` are the
    step means of ``token_values`` (see the module docstring; GAE, arXiv 1506.02438 Eq. 16, over the trace)."""
    width = step_rewards.shape[1]
    v_step = step_means(token_values, rank, width)
    ret = step_returns(step_rewards, gamma)
    adv_step = step_advantages(step_rewards, v_step, num_steps, gamma, lam)
    alive = torch.arange(width, device=rank.device)[None, :] < num_steps[:, None]
    v_next = _next(torch.where(alive, v_step, 0.0))
    adv = _at(step_rewards, rank) - token_values.float() + gamma * _at(v_next, rank) \
        + gamma * lam * _at(_next(adv_step), rank)
    counted = rank >= 0
    return _at(ret, rank), torch.where(counted, adv, 0.0)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8,
           total: Callable[[list[float]], list[float]] | None = None) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the ``mask``ed entries (PPO's advantage normalisation, as in OpenAI
    baselines' ``ppo2``); entries outside ``mask`` stay 0. The std is the population std (``unbiased=False``).

    ``total`` sums a list of numbers over the ranks (:func:`dllm_rl.training.ranks.sum_over_ranks`): the mean
    and std are then those of every rank's entries, as one process holding them all would compute. Every rank
    must call it (it runs two collectives)."""
    total = total or (lambda v: v)
    sel = values[mask].double()
    n, s = total([float(sel.numel()), float(sel.sum())])
    if n == 0:
        return torch.zeros_like(values)
    mean = s / n
    (q,) = total([float(((sel - mean) ** 2).sum())])
    std = (q / n) ** 0.5
    return torch.where(mask, (values - mean) / (std + eps), 0.0).to(values.dtype)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, float]:
    """``(loss, clip_frac)``: ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)`` averaged over the
    ``mask``ed tokens (PPO's clipped value loss, arXiv 1707.06347 Eq. 9's ``L^VF`` with the clipping of OpenAI
    baselines' ``ppo2``, as the published TraceRL value trainer uses it); ``clip_frac`` is the share of tokens
    whose clipped term is the larger."""
    m = mask.float()
    clipped = old_values + (values - old_values).clamp(-epsilon, epsilon)
    plain_sq, clip_sq = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * (torch.maximum(plain_sq, clip_sq) * m).sum() / m.sum().clamp(min=1.0)
    frac = float(((clip_sq > plain_sq).float() * m).sum() / m.sum().clamp(min=1.0))
    return loss, frac
