"""``tree_segment``: d-TreeRPO's one-forward likelihood of a tree segment (Pan et al. 2025, arXiv 2512.09675; the
released ``_get_local_transition_logps``).

A segment is one node of a tree rollout (:mod:`dllm_rl.rl.tree`): the tokens its decode committed on top of its
parent's state. The rollout row records it so: the parent's tokens are prefilled (``step_map`` -1), the node's own
tokens carry the step that committed them (``>= 0``), and slots the node left undecoded hold the mask id. The
segment's log-likelihood is ONE forward on the parent state, every token the node committed masked:

    log p(i) = log softmax(f(x_parent))[i, x_child[i]]   for i committed by the node, within completion_mask

(the child's answer up to its first EOS); every other token gets weight 0. No per-step replay (contrast ``trace``)
and no temperature. Block models are scored the same way, in one block-causal row on the parent state (the
released code covers LLaDA and Dream only). ``D = 1``, one row per sample that scores a token; deterministic.

``info["sibling_group"]`` (``[B]``) numbers the samples' parent states (prompt and parent completion): samples with
one number are siblings, which d-TreeRPO's self-distillation compares; ``info["tokens"]`` (``[B, G]``) are the
completions whose tokens they compare.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


@register("tree_segment")
def plan_tree_segment(model: DiffusionLM, batch: ScoringBatch, generator: torch.Generator | None = None) -> MaskedRows:
    """One row per sample: its parent state (the tokens with ``step_map >= 0`` masked), weight 1 on those within
    ``completion_mask`` (d-TreeRPO's segment likelihood, see the module docstring). The generator is accepted for
    the common signature and not used."""
    if batch.step_map is None:
        raise ValueError("the tree_segment estimator needs batch.step_map (which tokens each tree node decoded)")
    decoded = batch.step_map >= 0
    weight = (decoded & batch.completion_mask).float()
    sample = torch.nonzero(weight.any(-1)).flatten()
    parent = torch.where(decoded, model.mask_token_id, batch.completion_ids)
    prompt = torch.where(batch.prompt_mask, batch.prompt_ids, -1)
    _, group = torch.unique(torch.cat([prompt, parent], dim=1), dim=0, return_inverse=True)
    return build_rows(batch, sample, torch.zeros_like(sample), decoded[sample], weight[sample], model.mask_token_id,
                      1, info={"sibling_group": group, "tokens": batch.completion_ids})
