"""IGPO's entropy filter: of each sample's inpainted tokens, only the highest-entropy ones train.

IGPO (arXiv 2509.10396; facebookresearch/igpo, ``trainer_igpo.py`` ``_prepare_inputs``) inpaints pieces of the
reference solution into the completions of all-fail groups (:mod:`dllm_rl.rl.methods.igpo`); those tokens were
not sampled by the policy. Before the update, under the old policy and the training-time corruption (the
estimator's masked rows: with d1's mean-field estimator the whole completion masked), it ranks each sample's
inpainted tokens by the entropy of the model's full-vocabulary distribution there and keeps the top
``max(1, floor(fraction * n))`` of its ``n`` (``fraction`` 0.2 in the released run); the other inpainted tokens
leave the loss mask only: they stay in the input and the sample keeps its reward and advantage. Generated tokens
always train. Config: ``inpaint_entropy_keep`` (the IGPO preset sets 0.2); the rollout marks inpainted tokens in
``Rollout.prefilled``, and the mask reaches the estimator as ``ScoringBatch.loss_mask``.
"""

from __future__ import annotations

import torch

from dllm_rl.estimators import TokenScores


def top_entropy_keep(entropy: torch.Tensor, candidates: torch.Tensor, fraction: float) -> torch.Tensor:
    """``[B, G]`` bool: the tokens that train. Per row, every non-candidate token, and of its ``n`` candidates the
    ``max(1, int(n * fraction))`` with the largest ``entropy`` (``torch.topk``, as the released code; ties broken
    as topk breaks them). A row without candidates keeps everything."""
    keep = ~candidates
    for b in range(candidates.shape[0]):
        idx = torch.nonzero(candidates[b]).flatten()
        if len(idx):
            top = torch.topk(entropy[b, idx], max(1, int(len(idx) * fraction))).indices
            keep[b, idx[top]] = True
    return keep


def inpaint_loss_mask(entropy: TokenScores, inpainted: torch.Tensor, fraction: float) -> tuple[torch.Tensor, int, int]:
    """``(loss_mask [B, G], candidates, kept)``: :func:`top_entropy_keep` over ``inpainted`` tokens that the
    estimator scored (``entropy``: :func:`~dllm_rl.estimators.estimate` with ``entropy=True``; a token's entropy is
    its mean over the draws that scored it), with the numbers of candidate and kept inpainted tokens."""
    scored = entropy.weight != 0  # [D, B, G]
    count = scored.sum(0)
    mean = (entropy.logp * scored).sum(0) / count.clamp(min=1)
    candidates = inpainted.to(count.device) & (count > 0)
    keep = top_entropy_keep(mean, candidates, fraction)
    return keep, int(candidates.sum()), int((keep & candidates).sum())
