"""``egspo_steps``: the step likelihoods of EGSPO's entropy-selected denoising steps (arXiv 2603.12554).

EGSPO treats denoising as an MDP whose action at step ``t`` is the set of tokens committed there, with likelihood
``log pi(x_{t+1} | x_t) = sum_{i committed at t} log p(y_i | x_t)`` (one forward on the whole state ``x_t``, no
temperature). It trains on ``K`` steps per sample, the ones where the model was least certain: each step's score
is the mean full-vocabulary entropy of the tokens committed at it (the rollout records each token's entropy at
commit, ``Rollout.entropy``), and a sample's top-``K`` steps by that score are its draws, in descending order
(the released code, vishnutez/egspo-dllm-rl ``egspo_trainer.py``: ``_get_high_entropy_time_steps``,
``_get_per_token_logps_unbiased``; ``K = logps_eval_num_steps = 8``).

Draw ``d`` of sample ``b`` is one row: the state before its ``d``-th selected step ``t`` (every counted completion
token with ``step >= t`` masked, earlier ones revealed, the prompt clean) scoring the counted tokens committed at
``t`` with weight 1. Block models run the same single-stream rows under their block-causal rule: later blocks are
masked in ``x_t`` as in the sampler, and a block never attends to later ones anyway. A sample with fewer than ``K``
steps leaves the other draws empty.

Deviations: the entropy and the likelihood take the counted tokens (the answer up to its first EOS, as every
estimator here); the code's take every generated token, EOS padding included. The entropy is the exact
``-sum p log p`` (the code's adds 1e-8 inside the log). Ties go to the earlier step (the code's ``topk`` order).
``info``: ``step`` and ``step_entropy`` ``[K, B]`` (-1 and 0 for an empty draw).
"""

from __future__ import annotations

import torch

from dllm_rl.estimators.batch import MaskedRows, ScoringBatch
from dllm_rl.estimators.checks import check_int
from dllm_rl.estimators.registry import register
from dllm_rl.estimators.rows import build_rows
from dllm_rl.models.diffusion_lm import DiffusionLM


def select_steps(step_map: torch.Tensor, entropy: torch.Tensor, counted: torch.Tensor, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(steps, scores)``, both ``[B, k]``: each sample's ``k`` decoding steps with the highest mean entropy of the
    counted tokens committed at them, in descending order of it (ties: the earlier step first); -1 and 0 pad a
    sample with fewer steps."""
    b_n = step_map.shape[0]
    steps = torch.full((b_n, k), -1, dtype=torch.long, device=step_map.device)
    scores = torch.zeros(b_n, k, dtype=torch.float32, device=step_map.device)
    for b in range(b_n):
        keep = counted[b] & (step_map[b] >= 0)
        uniq, inv = torch.unique(step_map[b][keep], return_inverse=True)  # ascending steps
        if uniq.numel() == 0:
            continue
        total = torch.zeros(uniq.numel(), dtype=torch.float64, device=step_map.device)
        total.index_add_(0, inv, entropy[b][keep].double())
        mean = total / torch.bincount(inv, minlength=uniq.numel()).double()
        order = torch.argsort(-mean, stable=True)[:k]
        steps[b, : order.numel()] = uniq[order]
        scores[b, : order.numel()] = mean[order].float()
    return steps, scores


@register("egspo_steps")
def plan_egspo_steps(
    model: DiffusionLM,
    batch: ScoringBatch,
    generator: torch.Generator | None = None,
    *,
    num_steps: int = 8,
) -> MaskedRows:
    """EGSPO's step log-likelihoods at each sample's ``num_steps`` highest-entropy decoding steps (arXiv
    2603.12554; see the module docstring): ``num_steps`` draws, one row each. Needs the rollout's ``step_map`` and
    ``entropy``. Deterministic: the generator is accepted for the common signature and not used."""
    k = check_int("num_steps", num_steps, 1)
    if batch.step_map is None or batch.entropy is None:
        raise ValueError("the egspo_steps estimator needs batch.step_map and batch.entropy (a rollout's trace)")
    step = batch.step_map.long()
    counted = batch.completion_mask & (step >= 0)
    chosen, scores = select_steps(step, batch.entropy, counted, k)  # [B, K]
    t = chosen.t()[:, :, None]  # [K, B, 1]
    live = t >= 0
    masked = (counted[None] & (step[None] >= t) & live).reshape(k * batch.batch_size, -1)
    weight = (counted[None] & (step[None] == t) & live).float().reshape(k * batch.batch_size, -1)
    draw = torch.arange(k, device=step.device).repeat_interleave(batch.batch_size)
    sample = torch.arange(batch.batch_size, device=step.device).repeat(k)
    keep = weight.ne(0).any(-1)
    return build_rows(batch, sample[keep], draw[keep], masked[keep], weight[keep], model.mask_token_id, k,
                      info={"step": chosen.t().float(), "step_entropy": scores.t()})
