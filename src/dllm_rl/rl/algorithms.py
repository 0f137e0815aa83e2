"""Algorithm presets: each method is a choice of estimator, loss, KL and advantage.

A preset only fills the fields a user left at ``None``, so every part stays overridable (ESPO on a
block model, TraceRL on LLaDA, diffu-GRPO with leave-one-out, ...). The presets and the texts that list them are
:mod:`dllm_rl.rl.presets`. Each value is checked when the config is built (:mod:`dllm_rl.rl.config`); :func:`resolve`
checks the rules between fields, before any compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dllm_rl.config import ConfigError
from dllm_rl.estimators import NOISE, ScoringBatch, check_noise, estimator_forwards
from dllm_rl.estimators.registry import check_options, counterpart, estimator_options
from dllm_rl.rewards.speed import check_speed_config
from dllm_rl.rl.advantages import compute_advantages
from dllm_rl.rl.block_size import run_block_sizes
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.hooks import NO_HOOK, make_hook
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.presets import PRESETS
from dllm_rl.rl.value_config import check_value_model


def uniform_refusal(algorithm: str) -> str | None:
    """Why preset ``algorithm`` has no uniform-state form (a family without a mask token, DiffusionGemma), or None
    when it runs there: its estimator needs a uniform-state counterpart (the registry's
    :data:`~dllm_rl.estimators.registry.COUNTERPART`), and a loss back-propagated draw by draw replays masked rows."""
    preset = PRESETS[algorithm]
    est, loss = preset["estimator"], preset["loss_type"]
    if counterpart(est, "uniform") is None:
        return f"scores with {est}, which masks tokens"
    if POLICY_LOSSES[loss].draw_by_draw:
        return f"back-propagates its {loss} loss draw by draw over the masked rows of {est}"
    return None


def _uniform_preset(cfg: RLConfig, family) -> dict[str, Any]:
    """``cfg.algorithm``'s preset carried over to the uniform-state ``family``: its estimator replaced by the
    counterpart (``trace`` -> ``trajectory``, ``elbo`` -> ``uniform_elbo``) with the preset options that one takes;
    a preset without one is refused in one line naming why and the presets that run."""
    shrinkage = cfg.value_model.shrinkage
    if cfg.value_model.enabled and shrinkage not in (None, 1):
        raise ConfigError(f"value_model.shrinkage: {shrinkage} merges decoding steps; {family.name} is uniform-state "
                          "and its value model reads each step at its own canvas (dllm_rl.rl.value_uniform): set "
                          "value_model.shrinkage=1")
    preset = dict(PRESETS[cfg.algorithm])
    why = uniform_refusal(cfg.algorithm)
    uses_preset = cfg.estimator is None or (cfg.loss_type is None and "draw by draw" in (why or ""))
    if why and uses_preset:
        runs = [name for name in PRESETS if uniform_refusal(name) is None]
        raise ConfigError(f"algorithm={cfg.algorithm}: preset {cfg.algorithm} {why}; {family.name} is uniform-state "
                          f"(no mask token): use {', '.join(runs[:-1])} or {runs[-1]}")
    target = counterpart(preset["estimator"], "uniform")
    if target is not None and target != preset["estimator"]:
        takes = estimator_options(target)
        preset["estimator"] = target
        preset["estimator_options"] = {k: v for k, v in (preset["estimator_options"] or {}).items() if k in takes}
    return preset


def _fill_preset(cfg: RLConfig, attention: str, family=None) -> RLConfig:
    """``cfg`` with its ``None`` fields taken from its algorithm's preset (TraceRL's shrinkage per attention
    kind; a uniform-state ``family``'s counterpart estimators, :func:`_uniform_preset`); building the new config
    checks every value (:func:`dllm_rl.config.check_fields`)."""
    uniform = getattr(family, "noise", "mask") == "uniform"
    preset = _uniform_preset(cfg, family) if uniform else PRESETS[cfg.algorithm]
    skip = {"rollout_hook_options"} if cfg.rollout_hook == NO_HOOK else set()  # the preset's hook is switched off
    out = dataclasses.replace(cfg, **{k: v for k, v in preset.items() if getattr(cfg, k) is None and k not in skip})
    opts = dict(out.estimator_options or {})
    if out.estimator == "trace" and opts.get("step_merge"):  # one transition per decoding block
        if attention == "full":
            opts.setdefault("block_length", cfg.rollout.block_length or cfg.rollout.gen_length)
    elif out.estimator == "trace":
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
    try:  # the rule's options, on one dummy group (an unknown option, k above the group size)
        compute_advantages(cfg.advantage, torch.zeros(cfg.rollout.num_generations), cfg.rollout.num_generations,
                           cfg.scale_rewards, cfg.advantage_options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.reference == "base" and not cfg.lora.enabled:
        raise ConfigError("reference: 'base' (adapters disabled) needs lora.enabled=true; use reference=copy")
    if cfg.beta and POLICY_LOSSES[cfg.loss_type].kl_level is None:
        raise ConfigError(f"beta: the {cfg.loss_type!r} loss defines no KL term (its paper has none); set beta=0")
    try:
        hook = make_hook(cfg.rollout_hook, cfg.rollout_hook_options)
        if hook is not None and hook.check is not None:  # what the hook needs of the rest of the config
            hook.check(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.dynamic_sampling and not cfg.drop_zero_variance and cfg.accuracy_band is None and cfg.tpf_spread is None:
        raise ConfigError("dynamic_sampling: refills the groups that drop_zero_variance, accuracy_band or tpf_spread "
                          "drop; with drop_zero_variance=false and neither of the others nothing is dropped")
    if cfg.train.step_chunk_size and cfg.estimator != "trajectory":
        raise ConfigError(f"train.step_chunk_size: back-propagates the steps the trajectory estimator replays; "
                          f"estimator={cfg.estimator} replays none: set train.step_chunk_size=0")
    if cfg.train.step_chunk_size and POLICY_LOSSES[cfg.loss_type].draw_by_draw:
        raise ConfigError(f"train.step_chunk_size: the {cfg.loss_type} loss is back-propagated one draw at a time, "
                          "not by replayed steps: set train.step_chunk_size=0")
    check_value_model(cfg.value_model, cfg.loss_type)
    check_speed_config(cfg)
    from dllm_rl.rl.learned_threshold import check_learned

    check_learned(cfg)


def check_estimator_options(cfg: RLConfig, model) -> None:
    """Raise :class:`ConfigError` when ``estimator_options`` are not what the estimator takes (an unknown name, a
    value such as ``num_mc: -4``): the estimator plans the rows of one dummy completion (no model forward),
    which runs every check of its options, before the first rollout rather than at the first update. The dummy
    batch is laid out at the training block (``train_block_size``, which the updates score at), not the model's."""
    check_noise(model.family, cfg.estimator)  # an estimator of the other noise kind: one line naming those that fit
    if NOISE[cfg.estimator] == "uniform":  # a scorer plans no rows: its options are checked by name and value
        try:
            check_options(cfg.estimator, dict(cfg.estimator_options or {}))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"estimator_options: {exc}") from None
        return
    n = cfg.rollout.gen_length
    token = torch.full((1, n), model.eos_token_id, dtype=torch.long)
    batch = ScoringBatch(token[:, :1], torch.ones(1, 1, dtype=torch.bool), token, torch.ones(1, n, dtype=torch.bool),
                         step_map=torch.arange(n)[None], sample_seeds=torch.zeros(1, dtype=torch.long),
                         entropy=torch.zeros(1, n),
                         block_size=run_block_sizes(cfg, model.block_size)[1])
    try:
        estimator_forwards(model, cfg.estimator, batch, **(cfg.estimator_options or {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"estimator_options: {exc}") from None


def resolve(cfg: RLConfig, attention: str, family=None) -> RLConfig:
    """Fill ``cfg``'s ``None`` fields from its algorithm preset for a model of ``attention`` kind
    (``full`` | ``block``) and ``family`` (its noise kind: a uniform-state family takes the presets' counterpart
    estimators) and validate the result. Returns a new config."""
    out = _fill_preset(cfg, attention, family)
    check_combination(out)
    return out
