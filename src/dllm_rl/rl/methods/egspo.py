"""EGSPO, entropy-guided step selection (Kunde et al. 2026, arXiv 2603.12554; its code: vishnutez/egspo-dllm-rl).

Denoising is a finite-horizon MDP (state: the sequence after ``t`` steps; action: the tokens committed at step
``t``), whose policy gradient decomposes over the steps. EGSPO trains on the ``K`` steps per sample with the
highest mean predictive entropy of the tokens committed there. The paper's equation numbers could not be read here;
the facts come from its released code (``egspo/egspo_trainer.py``), which we follow.

* Estimator ``egspo_steps`` (:mod:`dllm_rl.estimators.egspo_steps`): each selected step is a draw whose weighted
  sum is the step log-likelihood ``log pi(x_{t+1} | x_t)`` (``logps_aggregation_mode="sum"``), ``K = 8``. The
  entropies are the rollout's (``Rollout.entropy``, computed by the sampler with the confidence, a few rows of a
  step at a time, so no ``[rows, positions, vocab]`` of the whole batch exists).
* Loss ``egspo``: PPO's clip on the step-level ratio ``exp(log pi_new(step) - log pi_old(step))`` per (sample,
  selected step), ``epsilon = 0.2``, ``epsilon_high = 0.5`` (``train.sh``); the mean over the (sample, step) cells
  divided by ``tokens_per_step`` (the code's ``max_completion_length / diffusion_steps``, 256 / 128 = 2).
* KL: k3 on the step log-likelihoods (``kl_level="draw"``). The code adds ``beta * KL`` (beta 0.04) inside the
  division by ``tokens_per_step``; ours adds it outside, so the preset's beta is ``0.04 / 2 = 0.02``.
* Stepwise advantages (EGSPO-SA, the rollout hook ``egspo_returns``; ``lambda = 0.5`` with ``normalize_returns``
  as ``train.sh`` runs it): each selected step's greedy one-step completion (the argmax of the step's logits at
  every slot still masked, the rollout's ``record_steps="greedy"``) is rewarded, ``R_k``; its return is
  ``G_k = (R + lambda (R - R_k)) / (1 + lambda)`` with ``R`` the final reward, and its advantage ``A_k = G_k -``
  the group's mean of ``G_k``, taken per selected-step column ``k`` (the ``k``-th highest-entropy step of each
  sample), no std division. The hook hands them on as token advantages (each token gets its step's), which the
  loss reads per (sample, step). ``lambda = 0`` (``rollout_hook_options={lam: 0}``) is the final reward minus the group
  mean (the code's ``ep_lambda1_0.0`` runs), what the loss computes without a hook from ``advantage:
  group_zscore``, ``scale_rewards: none``.

Deviations: the code takes one optimizer step per selected column (``K`` calls reuse a rollout, one column each,
off-policy after the first); ours puts a sample's ``K`` steps in one update (``train.num_iterations`` reuses the
rollout). Old log-probs are the current policy's before the update, as for every method here, where the code
records them in the rollout. The greedy completion covers the block being decoded: later blocks stay masked (the
sampler computes the current block's logits only; LLaDA's full attention would predict them too), so with several
blocks an early step's completion is partial. The recipe decodes 8 blocks of 32 as the code does: there, before the
last block, ``R_k`` is about 0 and ``G_k`` about ``R`` (lambda 0's advantage), where the code's completion fills
every block. A column mean takes the
samples that have the column (a sample with fewer than ``K`` steps has fewer); groups whose final rewards are all
equal are still dropped by ``drop_zero_variance`` as for every method (the code keeps them: their stepwise
advantages can differ), so the recipe sets ``drop_zero_variance: false``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.estimators.egspo_steps import select_steps
from dllm_rl.rl.hooks import HookContext, RolloutHook, RoundView, register_hook
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, clipped_surrogate, register_loss
from dllm_rl.rl.method import Method, Preset
from dllm_rl.rl.step_predictions import step_rollout, without_steps


def stepwise_advantages(final: torch.Tensor, step_rewards: torch.Tensor, valid: torch.Tensor, group_size: int,
                        lam: float, normalize: bool = True) -> torch.Tensor:
    """``[N, K]`` EGSPO-SA advantages (the code's ``_generate_and_score_completions``): ``G = R + lam (R - R_k)``
    (``/ (1 + lam)`` when ``normalize``) from the final rewards ``final`` ``[N]`` and the selected steps' one-step
    rewards ``step_rewards`` ``[N, K]``, minus the mean of ``G`` over each group of ``group_size`` consecutive samples,
    per column ``k``, over the samples where ``valid`` (0 elsewhere)."""
    n, k = step_rewards.shape
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} samples do not split into groups of {group_size}")
    r = final.float()[:, None]
    g = r + lam * (r - step_rewards.float())
    if normalize:
        g = g / (1.0 + lam)
    w = valid.float().view(-1, group_size, k)
    gv = (g * valid).view(-1, group_size, k)
    mean = gv.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1.0)
    return ((gv - mean) * w).view(n, k)


def token_advantages(step_map: torch.Tensor, steps: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """``[N, L]``: each completion token gets the advantage of its selected step (``steps`` ``[N, K]``, -1 for none;
    ``adv`` ``[N, K]``), 0 where its step was not selected."""
    hit = (step_map[:, None, :] == steps[:, :, None]) & (steps[:, :, None] >= 0)  # [N, K, L]
    return (hit.float() * adv[:, :, None].float()).sum(1)


@register_hook("egspo_returns")
def egspo_returns_hook(*, lam: float = 0.5, normalize: bool = True, num_steps: int = 8) -> RolloutHook:
    """EGSPO-SA's stepwise advantages (arXiv 2603.12554; see the module docstring): each sample's ``num_steps``
    highest-entropy steps (the ``egspo_steps`` estimator's, whose ``num_steps`` it must equal), their greedy
    one-step completions rewarded in one reward call, and ``[n, L]`` token advantages. ``stats``:
    ``egspo_step_reward`` (the mean reward of the selected steps' one-step completions)."""
    if lam < 0:
        raise ValueError(f"egspo_returns: lam must be >= 0, got {lam}")
    if num_steps < 1:
        raise ValueError(f"egspo_returns: num_steps must be >= 1, got {num_steps}")

    def hook(view: RoundView, ctx: HookContext) -> RoundView:
        ro = view.rollout
        if ro.step_tokens is None:
            raise ValueError("the egspo_returns hook needs rollouts decoded with record_steps (its factory asks for "
                             "them)")
        step_map = ro.step_map.long().cpu()
        counted = ro.completion_mask.cpu() & (step_map >= 0)
        steps, _ = select_steps(step_map, ro.entropy.cpu(), counted, num_steps)  # the estimator's own choice
        valid = steps >= 0
        rows, at = valid.nonzero(as_tuple=True)
        step_r = torch.zeros(steps.shape, dtype=torch.float32)
        if len(rows):
            values, _ = ctx.reward(rows.tolist(), step_rollout(ro, rows.tolist(), steps[rows, at].tolist(),
                                                               ctx.tokenizer, ctx.eos_ids, ctx.mask_token_id))
            step_r[rows, at] = torch.tensor(values, dtype=torch.float32)
        adv = stepwise_advantages(torch.tensor(view.rewards), step_r, valid, view.group_size, lam, normalize)
        stats = {"egspo_step_reward": float(step_r[valid].mean()) if valid.any() else 0.0}
        return replace(view, rollout=without_steps(ro), advantages=token_advantages(step_map, steps, adv),
                       stats={**view.stats, **stats})

    def check(cfg) -> None:
        if cfg.loss_type != "egspo":
            raise ValueError(f"loss_type: egspo_returns gives one advantage per (sample, step), which the egspo "
                             f"loss reads; loss_type is {cfg.loss_type!r}")
        if cfg.dynamic_sampling:
            raise ValueError("dynamic_sampling: egspo_returns computes each round's advantages itself (token "
                             "advantages of that round's width); set dynamic_sampling=false")
        if cfg.estimator != "egspo_steps":
            raise ValueError(f"rollout_hook: egspo_returns gives the advantages of the egspo_steps estimator's "
                             f"steps; estimator is {cfg.estimator!r}")
        k = (cfg.estimator_options or {}).get("num_steps", 8)
        if k != num_steps:
            raise ValueError(f"rollout_hook_options.num_steps: {num_steps} must equal estimator_options.num_steps "
                             f"({k}): the hook rewards the steps the estimator trains")
        if cfg.value_model.enabled:
            raise ValueError("value_model.enabled: egspo_returns computes the advantages itself; the value model "
                             "would replace them")

    return RolloutHook(hook, records_steps="greedy", check=check)


@register_loss("egspo", kl_level="draw")
def egspo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """EGSPO's clipped step-level surrogate (arXiv 2603.12554; the code's ``compute_loss``): ``z = sum_g w (logp_new
    - logp_old)`` per (draw = selected step, sample), ``-min(e^z A, clip(e^z) A)``, mean over the cells that score
    a token, divided by ``loss_options.tokens_per_step`` (default 1). ``advantages``: one per sample ``[B]``, or
    per completion token ``[B, L]`` (the ``egspo_returns`` hook's stepwise ones: a cell takes the mean over the
    tokens it scores, which all carry its step's)."""
    check_options(config, "egspo", ("tokens_per_step",))
    per_step = float(config.option("tokens_per_step", 1.0))
    if per_step <= 0:
        raise ValueError(f"loss_options.tokens_per_step must be > 0, got {per_step}")
    if advantages.dim() not in (1, 2):
        raise ValueError(f"the egspo loss takes advantages per sample [B] or per token [B, L], got shape "
                         f"{tuple(advantages.shape)}")
    z = (new.weight * (new.logp - old.logp.detach())).sum(-1)  # [D, B]
    scored = new.weight != 0
    cell = scored.any(-1)
    if advantages.dim() == 1:
        adv = advantages.float()[None, :]
    else:  # the step's advantage, read at the tokens the cell scores
        adv = (scored.float() * advantages.float()[None]).sum(-1) / scored.float().sum(-1).clamp(min=1.0)
    ratio = torch.exp(z)
    per_cell, clipped = clipped_surrogate(ratio, adv, config.epsilon, config.clip_high)
    loss = (per_cell * cell.float()).sum() / cell.float().sum().clamp(min=1.0) / per_step
    live = ratio.detach()[cell]
    stats = {"clip_frac": float(clipped[cell].float().mean()) if cell.any() else 0.0,
             "ratio_mean": float(live.mean()) if cell.any() else 1.0,
             "ratio_max_dev": float((live - 1).abs().max()) if cell.any() else 0.0}
    return LossOutput(loss, stats)


METHOD = Method(
    name="egspo", paper="EGSPO, arXiv 2603.12554", recipe="llada-egspo-math.yaml",
    preset=Preset(estimator="egspo_steps", estimator_options={"num_steps": 8}, loss_type="egspo",
                loss_options={"tokens_per_step": 2}, loss_aggregation="seq_mean", beta=0.02, kl_estimator="k3",
                advantage="group_zscore", scale_rewards="none", estimator_noise="sample",
                rollout_hook="egspo_returns", rollout_hook_options={"lam": 0.5, "num_steps": 8}),
    notes={"estimator": "top-K steps by committed-token entropy", "loss": "clip per (sample, step) ratio",
           "hook": "stepwise returns from each step's greedy completion (lambda 0.5)"},
)
