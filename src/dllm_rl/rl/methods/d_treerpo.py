"""d-TreeRPO: tree rollouts with bottom-up verifiable rewards (Pan et al. 2025, arXiv 2512.09675; facts from the
authors' THU-BPM/d-TreeRPO and DARE's yjyddq/DARE implementation; the paper's equation numbers could not be
checked here, only its abstract and the released code).

* Rollout: a tree per prompt (the ``d_treerpo`` rollout hook, :mod:`dllm_rl.rl.tree`): the root's
  ``rollout.num_generations`` children (the paper's M), every other inner node ``branch`` children (T), ``depth``
  levels (the contraction factor s); each child continues its parent's partial state through the sampler (the
  parent's tokens prefilled) with its own seed. Rewards on the leaves; a node's value is the mean of its
  children's; each non-root node is a training sample with the sibling-relative advantage ``A_i = V_i - mean of
  its siblings' V`` (the ``leave_one_out`` rule per sibling group, ``scale_rewards=none``; no std normalisation).
  A round holds ``M (1 + T + ... + T^(s-1))`` samples per prompt (20 for the released M = T = 4, s = 2).
* Likelihood: the ``tree_segment`` estimator (:mod:`dllm_rl.estimators.tree_segment`), one forward on the
  parent's state scoring the tokens the node committed.
* Loss ``d_treerpo``: PPO's clipped token surrogate (:func:`~dllm_rl.rl.losses.token_clipped_loss`), per segment
  the token mean over its scored tokens, then the mean over segments (``seq_mean``); no dual clip;
  ``epsilon = 0.4``; plus ``lambda(p) * SD``, the scheduled self-distillation (:func:`self_distillation`,
  :func:`sd_schedule`; ``p = step / train.max_steps``, the released ``max_steps`` being 30000). KL: k3 per token,
  same reduction, ``beta = 0.01`` (added by the trainer). Old log-probs once per step, reused over
  ``train.num_iterations`` (12 in the released recipe).

Deviations (we follow the code where paper and code could differ):

* Branch points are block boundaries (:mod:`dllm_rl.rl.tree`): the released recipe's steps 128 / 64 / 0 are.
* The completion mask cuts at the model's EOS (the authors; DARE uses the pad id, the same token for LLaDA).
* Update schedule: all segments of a step in ``train.num_iterations`` passes of micro-batches (DARE's PPO epochs);
  the authors instead take one parent's children per optimizer step, 12 times in a row.
* Self-distillation groups: the siblings of one parent state within a micro-batch (``tree_segment``'s
  ``sibling_group``). The authors pack whole sibling groups per optimizer step; DARE groups within micro-batches
  of one row, where the term all but vanishes. Ours holds whole groups when micro-batches do not cut them: a
  prompt's samples are level by level, so ``train.micro_batch_size`` a multiple of M with M a multiple of T (the
  recipe: M = T = 4, micro-batches of 8) never cuts one; other sizes compute the term over the parts of a group a
  micro-batch holds (DARE's behaviour). Two parents with the same state (e.g. root children that decoded nothing)
  form one group.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from dllm_rl.estimators import TokenScores
from dllm_rl.rl.hooks import HookContext, RolloutHook, RoundView, register_hook
from dllm_rl.rl.losses import LossConfig, LossOutput, check_options, register_loss, token_clipped_loss
from dllm_rl.rl.method import Method, Preset
from dllm_rl.rl.tree import TreeShape, grow_tree, node_values, sibling_advantages


@register_hook("d_treerpo")
def tree_rollout_hook(*, branch: int = 4, depth: int = 2) -> RolloutHook:
    """d-TreeRPO's tree rollouts (arXiv 2512.09675, the tree-rollout section; released ``_perform_tree_search_
    and_compute_advantages``): decodes the round itself as one tree per prompt of root ``rollout.num_generations``
    (M), ``branch`` (T) and ``depth`` (s), rewards the leaves and returns every non-root node as a sample with its
    value as reward and its sibling advantage (the run's ``advantage`` rule per sibling group). ``stats``:
    ``tree_leaf_reward`` (the mean leaf reward), ``tree_empty_segments`` (nodes that decoded no counted token)."""
    if branch < 1 or depth < 1:
        raise ValueError(f"d_treerpo: need branch >= 1 and depth >= 1, got {branch} and {depth}")

    def samples(num_generations: int) -> int:
        return TreeShape(num_generations, branch, depth).samples

    def hook(view: RoundView, ctx: HookContext) -> RoundView:
        per_root = samples(1)
        shape = TreeShape(view.group_size // per_root, branch, depth)
        n_prompts = len(view.seeds) // shape.samples
        spans = [ctx.span(p * shape.samples) for p in range(n_prompts)]
        tree = grow_tree(lambda idx, pre, until: ctx.generate(idx, pre, until_block=until), shape,
                         [b for b, _ in spans], [w for _, w in spans], ctx.mask_token_id)
        leaves = tree.leaf_rows()
        leaf_rewards, leaf_reasons = ctx.reward(leaves, tree.nodes.select(leaves))
        values = node_values(shape, torch.tensor(leaf_rewards, dtype=torch.float32).view(n_prompts, shape.leaves))
        adv = sibling_advantages(shape, values, ctx.advantage, ctx.scale_rewards, ctx.advantage_options)
        reasons = [f"tree node: mean of its leaves ({v:.4g})" for v in values.flatten().tolist()]
        for i, why in zip(leaves, leaf_reasons):
            reasons[i] = why
        scored = (tree.nodes.step_map >= 0) & tree.nodes.completion_mask
        stats = dict(view.stats)
        stats["tree_leaf_reward"] = stats.get("tree_leaf_reward", 0.0) + sum(leaf_rewards) / max(len(leaves), 1)
        stats["tree_empty_segments"] = stats.get("tree_empty_segments", 0.0) + float((~scored.any(-1)).sum())
        return replace(view, rollout=tree.nodes, rewards=values.flatten().tolist(), reasons=reasons,
                       advantages=adv.flatten().tolist(), stats=stats)

    return RolloutHook(hook, replaces_round=True, samples_per_prompt=samples)


def sd_schedule(progress: float, lambda_max: float = 3e-3, gamma: float = 2.0, tau_max: float = 2.0,
                beta: float = 0.7) -> tuple[float, float]:
    """``(lambda(p), tau(p))`` of d-TreeRPO's scheduled self-distillation (arXiv 2512.09675; released
    ``self_distillation_*`` settings): ``lambda = lambda_max (e^(gamma p) - 1) / (e^gamma - 1)`` ramps up and
    ``tau = max(tau_max (1 - p)^beta, 1e-6)`` decays, with ``p`` the training progress clamped to [0, 1]."""
    p = min(max(float(progress), 0.0), 1.0)
    lam = lambda_max * (math.exp(gamma * p) - 1.0) / (math.exp(gamma) - 1.0)
    return lam, max(tau_max * (1.0 - p) ** beta, 1e-6)


def self_distillation(logp: torch.Tensor, active: torch.Tensor, tokens: torch.Tensor, advantages: torch.Tensor,
                      groups: torch.Tensor, tau: float) -> torch.Tensor:
    """d-TreeRPO's self-distillation term (arXiv 2512.09675; released ``_compute_self_distillation_loss``): for each
    sibling group (``groups`` ``[B]``: the rows sharing one parent state) with at least 2 members, its children
    with ``A > 0`` get weights ``w = softmax(A / tau)``; at each position ``j`` some kept child scores (``active``
    ``[B, G]``), the target ``q_j(v)`` is the weight of the active kept children whose token (``tokens`` ``[B, G]``)
    is ``v``, renormalised, and ``KL_j = sum_v q_j(v) (log(q_j(v) + 1e-8) - log p_theta(v | parent))``. The
    siblings' rows share the parent state, so ``logp[b, j]`` (``[B, G]``, from ``tree_segment``) is that
    ``log p_theta``; the result is the mean of ``KL_j`` over every counted (group, position), 0 when none."""
    terms = []
    for g in torch.unique(groups).tolist():
        rows = torch.nonzero(groups == g).flatten()
        if len(rows) < 2:
            continue
        rows = rows[advantages[rows] > 0]
        if len(rows) == 0:
            continue
        w = torch.softmax(advantages[rows].float() / tau, dim=0)[:, None]  # [K, 1]
        act = active[rows].float()  # [K, G]
        tok = tokens[rows]
        z = (w * act).sum(0)  # [G]
        same = (tok[:, None, :] == tok[None, :, :]).float() * act[None, :, :]  # [K, K, G]: k's token = k2's
        q = (same * w[None, :, :]).sum(1) / (z + 1e-8)  # [K, G]: q_j(token of k)
        kl = (w * act / (z + 1e-8) * (torch.log(q + 1e-8) - logp[rows])).sum(0)  # [G]
        terms.append(kl[z > 0])
    counted = torch.cat(terms) if terms else logp.new_zeros(0)
    return counted.mean() if counted.numel() else logp.new_zeros(())


SD_OPTIONS = ("sd_lambda_max", "sd_gamma", "sd_tau_max", "sd_beta")


@register_loss("d_treerpo", kl_level="token")
def d_treerpo_loss(
    new: TokenScores, old: TokenScores, ref: TokenScores | None, advantages: torch.Tensor, lengths: torch.Tensor,
    config: LossConfig,
) -> LossOutput:
    """d-TreeRPO's objective (arXiv 2512.09675; released ``compute_loss``): the clipped token surrogate
    (:func:`~dllm_rl.rl.losses.token_clipped_loss`) plus ``lambda(p) * SD`` (:func:`self_distillation` over the
    siblings of each parent state in the micro-batch, at :func:`sd_schedule` of ``config.progress``). Options
    (``loss_options``): ``sd_lambda_max`` (3e-3; 0 turns the term off), ``sd_gamma`` (2), ``sd_tau_max`` (2),
    ``sd_beta`` (0.7). Needs the ``tree_segment`` estimator (its ``sibling_group``). Statistics: ``sd``,
    ``sd_lambda``."""
    check_options(config, "d_treerpo", SD_OPTIONS)
    if "sibling_group" not in new.info:
        raise ValueError("the d_treerpo loss needs the tree_segment estimator (estimator=tree_segment)")
    out = token_clipped_loss(new, old, ref, advantages, lengths, config)
    lam, tau = sd_schedule(config.progress, float(config.option("sd_lambda_max", 3e-3)),
                           float(config.option("sd_gamma", 2.0)), float(config.option("sd_tau_max", 2.0)),
                           float(config.option("sd_beta", 0.7)))
    sd = self_distillation(new.logp[0], new.weight[0] != 0, new.info["tokens"], advantages,
                           new.info["sibling_group"], tau)
    return LossOutput(out.loss + lam * sd, {**out.stats, "sd": float(sd.detach()), "sd_lambda": lam})


METHOD = Method(
    name="d_treerpo", paper="d-TreeRPO, arXiv 2512.09675", recipe="llada-d-treerpo-math.yaml",
    preset=Preset(estimator="tree_segment", estimator_options={}, loss_type="d_treerpo",
                loss_options={"sd_lambda_max": 3e-3, "sd_gamma": 2.0, "sd_tau_max": 2.0, "sd_beta": 0.7},
                loss_aggregation="seq_mean",
                beta=0.01, kl_estimator="k3", advantage="leave_one_out", scale_rewards="none",
                estimator_noise="sample", rollout_hook="d_treerpo",
                rollout_hook_options={"branch": 4, "depth": 2}),
    notes={"estimator": "one forward on the parent state per tree segment",
           "loss": "clipped token surrogate + scheduled self-distillation toward the better siblings",
           "hook": "tree rollouts: M = rollout.num_generations root children, branch T, depth s; sibling "
                   "advantages"},
)
