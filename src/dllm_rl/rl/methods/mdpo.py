"""MDPO: Masked Diffusion Policy Optimization (He, Renz, Cao, Geiger 2025, arXiv 2508.13148; facts from the
authors' autonomousvision/mdpo and from DARE's re-implementation, yjyddq/DARE ``mdpo_algos.py``).

A masked diffusion model predicts the whole answer at every decoding step, and a correct intermediate answer can be
refined into a wrong one ("answer backslide"). MDPO rewards every step's prediction and trains each step as an
action: the state before the step ``x_t`` and the step's full prediction ``x0_t``.

* Rollouts record every step's prediction (``generate(record_steps="sampled")``, :mod:`dllm_rl.sampling.step_record`:
  token ids and one score per slot, never logits). The hook ``mdpo`` rewards each step's prediction, decoded to
  text (:mod:`dllm_rl.rl.step_predictions`), through the round's own reward call with the prompts' data
  (``HookContext.reward``).
* Step advantages (:func:`step_advantages`, the released code's "adv-v3 + adv-v4", copied by DARE): per sample,
  ``s_t = (r_t - r_{t-1} + 1) + mean(r_{t+1..T-1})`` (``r_{-1} = 0``; the last step's future term is its own
  reward), normalised per step over the prompt's group: ``A = (s - mean) / (std + 1e-6)`` (unbiased std).
* Only the ``train_steps`` (K) steps of largest ``sum |A|`` over the round train (:func:`top_steps`), every sample
  at the same steps, sorted (DARE; the authors choose per process, which with their batch of one is per sample).
  Each (sample, step) pair becomes a training row (:class:`~dllm_rl.rl.hooks.TrainingRows`), step-major as DARE
  packs them.
* Estimator ``one_step`` (:mod:`dllm_rl.estimators.one_step`): ``log p(x0_t[i] | x_t)`` at every slot ``i`` masked
  in ``x_t``, from raw logits (DARE; the authors divide the logits by the sampling temperature).
* Loss ``mdpo`` (:func:`mdpo_loss`): PPO's clipped term per token, times the slot's sampling confidence (a fixed
  weight) and ``lambda_t = L / |M_t|`` (``L`` the completion length, ``|M_t|`` the slots masked in ``x_t``), summed
  over the slots and divided by ``|M_t|`` (``loss_aggregation: seq_mean``, a pair per micro-batch as DARE; the
  authors' sum over a step's micro-batch is ``token_mean``). No KL (DARE: ``use_kl_loss`` off; the authors' k2 at
  ``beta`` 0.0-0.02 is ``beta`` with ``kl_estimator: k2``).
* RCR, MDPO's Running-Confidence Remasking, is a decoding option of its own (``rollout.remasking: rcr``,
  :func:`dllm_rl.sampling.confidence.rcr_remask`); the released training recipes leave it off, as ours does.

Deviations (we follow DARE where the codes disagree): std + 1e-6 (authors 1e-4); top-K over the round (a rank's
share of the step's prompts); raw logits; LLaDA's even transfer schedule (the authors use MaskGIT's linear one);
the prediction covers the current block's masked slots only, later blocks stay masked (the sampler computes only the
block's logits; the authors' and DARE's predictions fill later blocks too, which matters with several blocks: the
recipe decodes one block, the authors' setting). A sample that finished in fewer steps than the round's longest keeps
its final answer as the prediction of the later steps (reward: its final reward) and has no pair there. The samples'
own rewards stay the outcome rewards (metrics and logs); every pair trains (the group filter judges samples).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.hooks import HookContext, RolloutHook, RoundView, TrainingRows, register_hook
from dllm_rl.rl.losses import AGGREGATIONS, LossConfig, LossOutput, check_options, clipped_surrogate, register_loss
from dllm_rl.rl.method import Method, Preset
from dllm_rl.rl.step_predictions import step_rollout, without_steps
from dllm_rl.sampling import Rollout

EPS = 1e-6  # DARE's std epsilon (the authors': 1e-4)


def step_scores(rewards: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` MDPO step scores of step rewards ``[N, T]`` (arXiv 2508.13148; the released "adv-v3 + adv-v4"):
    ``d_t = r_t - r_{t-1} + 1`` (``r_{-1} = 0``) plus ``c_t``, the mean of the strictly later rewards (``c_{T-1} =
    r_{T-1}``)."""
    r = rewards.float()
    prev = torch.cat([torch.zeros_like(r[:, :1]), r[:, :-1]], dim=1)
    later = r.flip(1).cumsum(1).flip(1) - r  # sum of r_{t+1..T-1}
    count = torch.arange(r.shape[1] - 1, -1, -1, device=r.device, dtype=r.dtype)  # T-1-t
    future = torch.where(count > 0, later / count.clamp(min=1), r)
    return r - prev + 1.0 + future


def step_advantages(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """``[N, T]`` advantages: :func:`step_scores` normalised per step over each group of ``group_size`` consecutive
    samples (GRPO, unbiased std, ``+ eps``); a group of one keeps its scores (mean 0, std 1, as DARE)."""
    s = step_scores(rewards)
    n, t = s.shape
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} samples do not split into groups of {group_size}")
    if group_size == 1:
        return s
    g = s.view(-1, group_size, t)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)).view(n, t)


def top_steps(advantages: torch.Tensor, k: int, valid: torch.Tensor) -> torch.Tensor:
    """The ``k`` steps (sorted) with the largest ``sum |A|`` over the samples where ``valid`` (``[N, T]``; DARE's
    ``select_top_k_steps`` over the whole batch), ties to the earlier step; steps valid for no sample never."""
    importance = (advantages.abs() * valid).sum(0)
    usable = valid.any(0)
    order = torch.sort(importance.masked_fill(~usable, -1.0), descending=True, stable=True).indices
    k = min(k, int(usable.sum()))
    return order[:k].sort().values


def pair_rollout(rollout: Rollout, samples: list[int], steps: list[int], mask: int) -> Rollout:
    """One row per (sample, step) pair: the completion is the step's prediction, ``completion_mask`` the slots it
    predicted (masked in the state before it; all other slots are the state's: committed tokens, later blocks'
    mask ids), ``confidence`` their sampling scores."""
    sub = rollout.select(samples)
    idx = torch.arange(len(samples))
    t = torch.as_tensor(steps)
    tokens = sub.step_tokens[idx, t].long()
    scored = sub.step_masked[idx, t] & (tokens != mask)
    return without_steps(sub, completion_ids=tokens, completion_mask=scored, texts=None,
                         confidence=sub.step_confidence[idx, t] * scored)


def step_rewards(view: RoundView, ctx: HookContext, mask: int) -> torch.Tensor:
    """``[N, T]`` the reward of every step's prediction (``T`` the round's most steps): one reward call per step
    over the samples that took it; a sample's steps past its own count keep its final answer and reward."""
    ro = view.rollout
    n, steps = len(ro), ro.step_tokens.shape[1]
    counts = ro.nfe.tolist()
    r = torch.tensor(view.rewards, dtype=torch.float32)[:, None].repeat(1, steps)
    for t in range(steps):
        rows = [b for b in range(n) if t < counts[b]]
        if rows:
            values, _ = ctx.reward(rows, step_rollout(ro, rows, [t] * len(rows), ctx.tokenizer, ctx.eos_ids,
                                                      mask))
            r[rows, t] = torch.tensor(values, dtype=torch.float32)
    return r


@register_hook("mdpo")
def mdpo_hook(*, train_steps: int = 16) -> RolloutHook:
    """MDPO's step rewards, step advantages and top-K steps (arXiv 2508.13148; see the module docstring): the
    round's training rows are the (sample, step) pairs of the ``train_steps`` steps of largest ``sum |A|``.
    ``stats``:
    ``mdpo_step_reward`` (mean reward of the steps' predictions), ``mdpo_backslide`` (samples whose final reward is
    below their best step's), ``mdpo_pairs``."""
    if train_steps < 1:
        raise ValueError(f"mdpo: train_steps must be >= 1, got {train_steps}")

    def hook(view: RoundView, ctx: HookContext) -> RoundView:
        ro = view.rollout
        if ro.step_tokens is None:
            raise ValueError("the mdpo hook needs rollouts decoded with record_steps (its factory asks for them)")
        mask = ctx.tokenizer.mask_token_id  # the id still-masked slots hold (the loader checks the model's is it)
        r = step_rewards(view, ctx, mask)
        adv = step_advantages(r, view.group_size)
        steps = r.shape[1]
        valid = (torch.arange(steps)[None, :] < ro.nfe.cpu()[:, None]) & ro.step_masked.cpu().any(-1)
        chosen = top_steps(adv, train_steps, valid).tolist()
        pairs = [(b, t) for t in chosen for b in range(len(ro)) if valid[b, t]]  # step-major, as DARE packs them
        samples, at = [b for b, _ in pairs], [t for _, t in pairs]
        rows = pair_rollout(ro, samples, at, mask)
        training = TrainingRows(rows, adv[samples, at] if pairs else torch.zeros(0), samples)
        final = torch.tensor(view.rewards)
        stats = {"mdpo_step_reward": float(r[valid].mean()) if valid.any() else 0.0,
                 "mdpo_backslide": float((r.max(1).values > final).sum()), "mdpo_pairs": float(len(pairs))}
        return replace(view, rollout=without_steps(ro), training=training, stats={**view.stats, **stats})

    return RolloutHook(hook, records_steps="sampled", makes_training_rows=True)


@register_loss("mdpo", kl_level="token")
def mdpo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """MDPO's step loss (arXiv 2508.13148, section 3; DARE ``compute_mdpo_policy_loss``): per scored slot
    ``max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps)) * lambda * conf`` with ``lambda = L / |M|`` (``L`` =
    ``config.max_length``, the completion length; ``|M|`` the row's scored slots, at least 1) and ``conf`` the slot's
    sampling confidence (``new.info["confidence"]``, no gradient), reduced by ``config.aggregation`` over the scored
    slots (``seq_mean``: ``sum / |M|`` per row, mean over rows). ``advantages`` ``[B]``: one per (sample, step) row."""
    check_options(config, "mdpo", ())
    if "confidence" not in new.info:
        raise ValueError("the mdpo loss weights tokens by their sampling confidence: score with the one_step "
                         "estimator on a batch that carries confidence")
    adv = advantages.float().view(1, -1, 1)
    ratio = torch.exp(new.logp - old.logp.detach())
    per_token, was_clipped = clipped_surrogate(ratio, adv, config.epsilon, config.clip_high)
    active = new.weight != 0
    lam = config.max_length / active.sum(-1, keepdim=True).clamp(min=1)
    conf = new.info["confidence"].to(per_token.device).float().detach()
    loss = AGGREGATIONS[config.aggregation](per_token * lam * conf * active, active.float(), config.max_length)
    stats = {
        "clip_frac": float(was_clipped[active].float().mean()) if active.any() else 0.0,
        "ratio_mean": float(ratio.detach()[active].mean()) if active.any() else 1.0,
        "ratio_max_dev": float((ratio.detach()[active] - 1).abs().max()) if active.any() else 0.0,
    }
    return LossOutput(loss, stats)


METHOD = Method(
    name="mdpo", paper="MDPO, arXiv 2508.13148", recipe="llada-mdpo-math.yaml",
    preset=Preset(estimator="one_step", estimator_options={}, loss_type="mdpo", loss_aggregation="seq_mean", beta=0.0,
                kl_estimator="k2", advantage="group_zscore", scale_rewards="group", estimator_noise="sample",
                rollout_hook="mdpo", rollout_hook_options={"train_steps": 16}),
    notes={"estimator": "each step's state -> its prediction",
           "loss": "tokens weighted by confidence x L / masked count",
           "hook": "step rewards, top-K steps by absolute advantage"},
)
