"""Algorithm presets: each method is a choice of estimator, loss, KL and advantage.

A preset only fills the fields a user left at ``None``, so every part stays overridable (ESPO on a
block model, TraceRL on LLaDA, diffu-GRPO with leave-one-out, ...). Each value is checked when the config
is built (:mod:`dllm_rl.rl.config`); :func:`resolve` checks the rules between fields, before any compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dllm_rl.config import ConfigError
from dllm_rl.rl.config import RLConfig

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


def _fill_preset(cfg: RLConfig, attention: str) -> RLConfig:
    """``cfg`` with its ``None`` fields taken from its algorithm's preset (TraceRL's shrinkage per attention
    kind); building the new config checks every value (:func:`dllm_rl.config.check_fields`)."""
    preset = PRESETS[cfg.algorithm]
    out = dataclasses.replace(cfg, **{k: v for k, v in preset.items() if getattr(cfg, k) is None})
    opts = dict(out.estimator_options or {})
    if out.estimator == "trace":
        opts.setdefault("shrinkage", 1 if attention == "block" else 8)
    return dataclasses.replace(out, estimator_options=opts)


def check_combination(cfg: RLConfig) -> None:
    """The rules between fields of a resolved config (single values are checked when it is built)."""
    if not cfg.model:
        raise ConfigError("model: set the checkpoint directory (model=PATH)")
    if cfg.advantage == "leave_one_out" and cfg.num_generations < 2:
        raise ConfigError("num_generations: leave_one_out needs at least 2 generations per prompt")
    if cfg.reference == "base" and not cfg.lora.enabled:
        raise ConfigError("reference: 'base' (adapters disabled) needs lora.enabled=true; use reference=copy")
    if cfg.dynamic_sampling and not cfg.drop_zero_variance and cfg.accuracy_band is None:
        raise ConfigError("dynamic_sampling: refills the groups that drop_zero_variance or accuracy_band drop; "
                          "with drop_zero_variance=false and no accuracy_band nothing is dropped")


def resolve(cfg: RLConfig, attention: str) -> RLConfig:
    """Fill ``cfg``'s ``None`` fields from its algorithm preset for a model of ``attention`` kind
    (``full`` | ``block``) and validate the result. Returns a new config."""
    out = _fill_preset(cfg, attention)
    check_combination(out)
    return out
