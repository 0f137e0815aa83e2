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
* Advantage: the final reward minus the group mean, no std division (``scale_rewards=none``); the code's mean is
  taken per selected-step column, the same for every column when the return is the final reward.

Not implemented (EGSPO-SA's stepwise advantages): the return ``G_k = (R + lambda (R - R_k)) / (1 + lambda)`` with
``R_k`` the reward of the greedy one-step completion from the step's state (``lambda = 0.5`` in ``train.sh``) needs
the sampler to keep a greedy completion per step and the reward of each; this preset is the ``lambda = 0`` setting
(the code's ``ep_lambda1_0.0`` runs). Other deviations: the code takes one optimizer step per selected column (``K``
calls reuse a rollout, one column each, off-policy after the first); ours puts a sample's ``K`` steps in one update
(``train.num_iterations`` reuses the rollout). Old log-probs are the current policy's before the update, as for every
method here, where the code records them in the rollout.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, clipped_surrogate, register_loss
from dllm_rl.rl.method import Method


@register_loss("egspo", kl_level="draw")
def egspo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """EGSPO's clipped step-level surrogate (arXiv 2603.12554; the code's ``compute_loss``): ``z = sum_g w (logp_new
    - logp_old)`` per (draw = selected step, sample), ``-min(e^z A, clip(e^z) A)``, mean over the cells that score
    a token, divided by ``loss_options.tokens_per_step`` (default 1)."""
    check_options(config, "egspo", ("tokens_per_step",))
    per_step = float(config.option("tokens_per_step", 1.0))
    if per_step <= 0:
        raise ValueError(f"loss_options.tokens_per_step must be > 0, got {per_step}")
    if advantages.dim() != 1:
        raise ValueError(f"the egspo loss takes one advantage per sample ([B]), got shape {tuple(advantages.shape)}")
    z = (new.weight * (new.logp - old.logp.detach())).sum(-1)  # [D, B]
    cell = (new.weight != 0).any(-1)
    ratio = torch.exp(z)
    per_cell, clipped = clipped_surrogate(ratio, advantages.float()[None, :], config.epsilon, config.clip_high)
    loss = (per_cell * cell.float()).sum() / cell.float().sum().clamp(min=1.0) / per_step
    live = ratio.detach()[cell]
    stats = {"clip_frac": float(clipped[cell].float().mean()) if cell.any() else 0.0,
             "ratio_mean": float(live.mean()) if cell.any() else 1.0,
             "ratio_max_dev": float((live - 1).abs().max()) if cell.any() else 0.0}
    return LossOutput(loss, stats)


METHOD = Method(
    name="egspo", paper="EGSPO, arXiv 2603.12554", recipe="llada-egspo-math.yaml",
    preset=dict(estimator="egspo_steps", estimator_options={"num_steps": 8}, loss_type="egspo",
                loss_options={"tokens_per_step": 2}, loss_aggregation="seq_mean", beta=0.02, kl_estimator="k3",
                advantage="group_zscore", scale_rewards="none", estimator_noise="sample"),
    notes={"estimator": "top-K steps by committed-token entropy", "loss": "clip per (sample, step) ratio; "
           "final-reward advantage (no stepwise returns)"},
)
