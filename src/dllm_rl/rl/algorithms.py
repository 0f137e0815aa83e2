"""Algorithm presets: each method is a choice of estimator, loss, KL and advantage.

A preset only fills the fields a user left at ``None``, so every part stays overridable (ESPO on a
block model, TraceRL on LLaDA, diffu-GRPO with leave-one-out, ...). :func:`resolve` also checks the
combination before any compute and names the bad key and its allowed values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dllm_rl.config import ConfigError
from dllm_rl.estimators import ESTIMATORS
from dllm_rl.models.loading import DTYPES
from dllm_rl.rl.advantages import ADVANTAGES
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.kl import KL_ESTIMATORS
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.value_config import check_value_model

# Paper defaults. "trace_shrinkage" is resolved per attention kind (TraceRL: s=1 block, s=8 full).
PRESETS: dict[str, dict[str, Any]] = {
    # ESPO (arXiv 2512.03759): sequence-level ratio on the ELBO, k2 KL, leave-one-out advantages. Ours: a
    # prompt's rollouts share the ELBO's masks (estimator_noise=group), so the leave-one-out gradients on the
    # tokens they share cancel (benchmarks/LEARNING.md: it lifted ESPO on both demo models).
    "espo": dict(estimator="elbo", estimator_options={"num_mc": 2, "coupled": True}, loss_type="sequence",
                 loss_aggregation="seq_mean", beta=0.0, kl_estimator="k2", advantage="leave_one_out",
                 scale_rewards="none", estimator_noise="group"),
    # TraceRL (arXiv 2509.06949): the inference trace as the policy's action sequence, token-level ratio.
    "tracerl": dict(estimator="trace", estimator_options={}, loss_type="token", loss_aggregation="token_mean",
                    beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
                    estimator_noise="sample"),
    # diffu-GRPO (d1, arXiv 2504.12216): mean-field one-step estimate with random prompt masking.
    "diffu_grpo": dict(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="token",
                       loss_aggregation="seq_mean", beta=0.04, kl_estimator="k3", advantage="group_zscore",
                       scale_rewards="group", estimator_noise="sample"),
    # coupled-GRPO (DiffuCoder, arXiv 2506.20639): a mask and its complement score every token once.
    "coupled_grpo": dict(estimator="coupled", estimator_options={}, loss_type="token",
                         loss_aggregation="token_mean", beta=0.0, kl_estimator="k3", advantage="group_zscore",
                         scale_rewards="group", estimator_noise="sample"),
    # UniGRPO / random-masking GRPO (MMaDA, arXiv 2505.15809).
    "random_mask_grpo": dict(estimator="random_mask", estimator_options={}, loss_type="token",
                             loss_aggregation="token_mean", beta=0.0, kl_estimator="k3",
                             advantage="group_zscore", scale_rewards="group", estimator_noise="sample"),
}


def _check(name: str, value: Any, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")


def resolve(cfg: RLConfig, attention: str) -> RLConfig:
    """Fill ``cfg``'s ``None`` fields from its algorithm preset for a model of ``attention`` kind
    (``full`` | ``block``) and validate the result. Returns a new config."""
    _check("algorithm", cfg.algorithm, PRESETS)
    preset = dict(PRESETS[cfg.algorithm])
    updates = {k: v for k, v in preset.items() if getattr(cfg, k) is None}
    out = dataclasses.replace(cfg, **updates)
    opts = dict(out.estimator_options or {})
    if out.estimator == "trace":
        opts.setdefault("shrinkage", 1 if attention == "block" else 8)
    out = dataclasses.replace(out, estimator_options=opts)

    _check("estimator", out.estimator, ESTIMATORS)
    _check("loss_type", out.loss_type, POLICY_LOSSES)
    _check("loss_aggregation", out.loss_aggregation, ("token_mean", "seq_mean", "fixed_length"))
    _check("kl_estimator", out.kl_estimator, KL_ESTIMATORS)
    _check("advantage", out.advantage, ADVANTAGES)
    _check("scale_rewards", out.scale_rewards, ("group", "batch", "none"))
    _check("reference", out.reference, ("copy", "base"))
    _check("estimator_noise", out.estimator_noise, ("sample", "group"))
    _check("rollout.cache", out.rollout.cache, ("none", "prefix", "dual"))
    if out.rollout.dtype is not None:
        _check("rollout.dtype", out.rollout.dtype, (*DTYPES, "auto"))
    for name, schedule in (("rollout", out.rollout), ("eval", out.eval)):
        if schedule.threshold is not None and not 0.0 < schedule.threshold <= 1.0:
            raise ConfigError(f"{name}.threshold: must be in (0, 1], got {schedule.threshold}")
        if schedule.steps is not None and schedule.steps < 1:
            raise ConfigError(f"{name}.steps: must be >= 1, got {schedule.steps}")
    if out.advantage == "leave_one_out" and out.num_generations < 2:
        raise ConfigError("num_generations: leave_one_out needs at least 2 generations per prompt")
    if out.num_generations < 1 or out.prompts_per_step < 1 or out.micro_batch_size < 1:
        raise ConfigError("num_generations, prompts_per_step and micro_batch_size must be >= 1")
    if out.num_iterations < 1:
        raise ConfigError(f"num_iterations: must be >= 1, got {out.num_iterations}")
    if not 0.0 <= out.ema_decay < 1.0:
        raise ConfigError(f"ema_decay: must be in [0, 1), got {out.ema_decay}")
    if out.beta < 0:
        raise ConfigError(f"beta: must be >= 0, got {out.beta}")
    if out.reference == "base" and not out.lora.enabled:
        raise ConfigError("reference: 'base' (adapters disabled) needs lora.enabled=true; use reference=copy")
    if out.accuracy_band is not None and len(out.accuracy_band) != 2:
        raise ConfigError("accuracy_band: give two numbers [lo, hi]")
    if out.max_sampling_rounds < 1:
        raise ConfigError(f"max_sampling_rounds: must be >= 1, got {out.max_sampling_rounds}")
    if out.dynamic_sampling and not out.drop_zero_variance and out.accuracy_band is None:
        raise ConfigError("dynamic_sampling: refills the groups that drop_zero_variance or accuracy_band drop; "
                          "with drop_zero_variance=false and no accuracy_band nothing is dropped")
    check_value_model(out.value_model, out.loss_type)
    if not out.model:
        raise ConfigError("model: set the checkpoint directory (model=PATH)")
    return out
