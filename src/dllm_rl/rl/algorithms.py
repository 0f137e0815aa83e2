"""Algorithm presets: each method is a choice of estimator, loss, KL and advantage.

A preset only fills the fields a user left at ``None``, so every part stays overridable (ESPO on a
block model, TraceRL on LLaDA, diffu-GRPO with leave-one-out, ...). Each value is checked when the config
is built (:mod:`dllm_rl.rl.config`); :func:`resolve` checks the rules between fields, before any compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dllm_rl.config import ConfigError
from dllm_rl.estimators import ScoringBatch, estimator_forwards
from dllm_rl.rl import methods  # noqa: F401  (registers every method's parts)
from dllm_rl.rl.block_size import run_block_sizes
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.hooks import make_hook
from dllm_rl.rl.value_config import check_value_model

# Paper defaults (paper fidelity; tuned demo settings live in the demo configs, src/dllm_rl/assets/demo).
# "trace_shrinkage" is resolved per attention kind (TraceRL: s=1 block, s=8 full); SPG's block_length
# follows the rollout's decoding block. Settings a preset cannot hold (lr, train.num_iterations, lengths) are in
# each method's recipe in configs/.
PRESETS: dict[str, dict[str, Any]] = {
    # ESPO (arXiv 2512.03759): sequence-level ratio on the ELBO, k2 KL with beta 0.01 (its train.yaml; 3e-3 for
    # Countdown), leave-one-out advantages. Ours: a prompt's rollouts share the ELBO's masks
    # (estimator_noise=group), so the leave-one-out gradients on the tokens they share cancel
    # (benchmarks/LEARNING.md: it lifted ESPO on both demo models).
    "espo": dict(estimator="elbo", estimator_options={"num_mc": 2, "coupled": True}, loss_type="sequence",
                 loss_aggregation="seq_mean", beta=0.01, kl_estimator="k2", advantage="leave_one_out",
                 scale_rewards="none", estimator_noise="group"),
    # TraceRL (arXiv 2509.06949): the inference trace as the policy's action sequence, token-level ratio,
    # KL beta 0.01 (the paper's setting).
    "tracerl": dict(estimator="trace", estimator_options={}, loss_type="token", loss_aggregation="token_mean",
                    beta=0.01, kl_estimator="k3", advantage="group_zscore", scale_rewards="group",
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
    # SPG (arXiv 2510.09541, released code): block-wise masking with 2 draws, ELBO for A > 0 and the
    # EUBO/ELBO mixture (eubo_beta 1.5, weight 0.5: its Countdown mixture script) for the rest, ratio-free,
    # no KL, advantages r - mean (unscaled).
    "spg": dict(estimator="spg_block", estimator_options={"num_mc": 2}, loss_type="spg",
                loss_options={"mode": "mix", "eubo_beta": 1.5, "mix_weight": 0.5}, loss_aggregation="seq_mean",
                beta=0.0, kl_estimator="k3", advantage="group_zscore", scale_rewards="none",
                estimator_noise="sample"),
    # BGPO (arXiv 2510.11683): its linear lower bound on the ELBO, 16 MC draws (the paper's large-sample
    # setting; not confirmed from its code), back-propagated draw by draw. Block models: the block ELBO (EBPO).
    "bgpo": dict(estimator="elbo", estimator_options={"num_mc": 16, "coupled": False}, loss_type="bgpo",
                 loss_aggregation="seq_mean", beta=0.0, kl_estimator="k2", advantage="group_zscore",
                 scale_rewards="group", estimator_noise="sample"),
    # JustGRPO (arXiv 2601.15165, released code): exact left-to-right likelihood, token clip 0.2, sum over
    # tokens / generation length, no KL, GRPO advantages. (Its rollouts decode one token per step, left to
    # right: rollout.block_length=1 in its recipe.)
    "justgrpo": dict(estimator="left_to_right", estimator_options={}, loss_type="token",
                     loss_aggregation="fixed_length", beta=0.0, kl_estimator="k3", advantage="group_zscore",
                     scale_rewards="group", estimator_noise="sample"),
    # wd1 (arXiv 2507.08838, released wll_d1_neg trainer): d1's mean-field estimate, ratio-free weighted
    # log-likelihood with softmax(A) - softmax(-A) weights, no reference policy.
    "wd1": dict(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="weighted_loglik",
                loss_aggregation="seq_mean", beta=0.0, kl_estimator="k3", advantage="wd1_weights",
                scale_rewards="none", estimator_noise="sample"),
    # IGPO (arXiv 2509.10396, released run_igpo.sh): GRPO with d1's masking and GSPO's sequence ratio, beta
    # 0.01, plus the inpainting hook on all-fail groups (ratio U(0.2, 0.6), chunks 5-10, <= 4 replacements).
    "igpo": dict(estimator="mean_field", estimator_options={"p_mask_prompt": 0.15}, loss_type="sequence",
                 loss_aggregation="seq_mean", beta=0.01, kl_estimator="k3", advantage="group_zscore",
                 scale_rewards="group", estimator_noise="sample", rollout_hook="igpo",
                 rollout_hook_options={"max_replacements": 4, "ratio_low": 0.2, "ratio_high": 0.6,
                                       "min_chunk": 5, "max_chunk": 10}),
}


def _fill_preset(cfg: RLConfig, attention: str) -> RLConfig:
    """``cfg`` with its ``None`` fields taken from its algorithm's preset (TraceRL's shrinkage per attention
    kind); building the new config checks every value (:func:`dllm_rl.config.check_fields`)."""
    preset = PRESETS[cfg.algorithm]
    out = dataclasses.replace(cfg, **{k: v for k, v in preset.items() if getattr(cfg, k) is None})
    opts = dict(out.estimator_options or {})
    if out.estimator == "trace":
        opts.setdefault("shrinkage", 1 if attention == "block" else 8)
    if out.estimator == "spg_block" and attention == "full":
        opts.setdefault("block_length", cfg.rollout.block_length)
    return dataclasses.replace(out, estimator_options=opts)


def check_combination(cfg: RLConfig) -> None:
    """The rules between fields of a resolved config (single values are checked when it is built)."""
    if not cfg.model.path:
        raise ConfigError("model.path: set the checkpoint directory (model.path=PATH)")
    if cfg.advantage == "leave_one_out" and cfg.rollout.num_generations < 2:
        raise ConfigError("rollout.num_generations: leave_one_out needs at least 2 generations per prompt")
    if cfg.reference == "base" and not cfg.lora.enabled:
        raise ConfigError("reference: 'base' (adapters disabled) needs lora.enabled=true; use reference=copy")
    try:
        make_hook(cfg.rollout_hook, cfg.rollout_hook_options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.dynamic_sampling and not cfg.drop_zero_variance and cfg.accuracy_band is None:
        raise ConfigError("dynamic_sampling: refills the groups that drop_zero_variance or accuracy_band drop; "
                          "with drop_zero_variance=false and no accuracy_band nothing is dropped")
    check_value_model(cfg.value_model, cfg.loss_type)


def check_estimator_options(cfg: RLConfig, model) -> None:
    """Raise :class:`ConfigError` when ``estimator_options`` are not what the estimator takes (an unknown name, a
    value such as ``num_mc: -4``): the estimator plans the rows of one dummy completion (no model forward),
    which runs every check of its options, before the first rollout rather than at the first update. The dummy
    batch is laid out at the training block (``train_block_size``, which the updates score at), not the model's."""
    n = cfg.rollout.gen_length
    token = torch.full((1, n), model.eos_token_id, dtype=torch.long)
    batch = ScoringBatch(token[:, :1], torch.ones(1, 1, dtype=torch.bool), token, torch.ones(1, n, dtype=torch.bool),
                         step_map=torch.arange(n)[None], sample_seeds=torch.zeros(1, dtype=torch.long),
                         block_size=run_block_sizes(cfg, model.block_size)[1])
    try:
        estimator_forwards(model, cfg.estimator, batch, **(cfg.estimator_options or {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"estimator_options: {exc}") from None


def resolve(cfg: RLConfig, attention: str) -> RLConfig:
    """Fill ``cfg``'s ``None`` fields from its algorithm preset for a model of ``attention`` kind
    (``full`` | ``block``) and validate the result. Returns a new config."""
    out = _fill_preset(cfg, attention)
    check_combination(out)
    return out


PAPERS: dict[str, str] = {
    "espo": "ESPO, arXiv 2512.03759", "tracerl": "TraceRL, arXiv 2509.06949", "diffu_grpo": "d1, arXiv 2504.12216",
    "coupled_grpo": "DiffuCoder, arXiv 2506.20639", "random_mask_grpo": "MMaDA UniGRPO, arXiv 2505.15809",
    "spg": "SPG, arXiv 2510.09541", "bgpo": "BGPO, arXiv 2510.11683", "justgrpo": "JustGRPO, arXiv 2601.15165",
    "wd1": "wd1, arXiv 2507.08838", "igpo": "IGPO, arXiv 2509.10396",
}


def preset_table() -> list[str]:
    """One line per preset: its paper and the fields it fills (for ``dllm-rl rl --help-config``)."""
    lines = ["presets (algorithm=NAME fills the fields left unset; anything you set wins):"]
    for name, preset in PRESETS.items():
        parts = [f"estimator={preset['estimator']}{preset['estimator_options'] or ''}", f"loss={preset['loss_type']}"]
        if preset.get("loss_options"):
            parts.append(f"loss_options={preset['loss_options']}")
        parts += [f"aggregation={preset['loss_aggregation']}", f"beta={preset['beta']}", f"kl={preset['kl_estimator']}",
                  f"advantage={preset['advantage']}/{preset['scale_rewards']}", f"noise={preset['estimator_noise']}"]
        if preset.get("rollout_hook"):
            parts.append(f"hook={preset['rollout_hook']}")
        lines.append(f"  {name} ({PAPERS[name]}): " + ", ".join(parts))
    return lines
