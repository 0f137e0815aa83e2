"""Log-likelihood estimators for diffusion LMs: ``trace``, ``elbo``, ``mean_field``, ``random_mask``, ``coupled``.

Each estimator is one function ``f(model, batch, generator, **options) -> TokenScores`` registered by name
in :data:`ESTIMATORS`; :func:`estimate` dispatches by name. The only randomness is the passed
``torch.Generator``: identically seeded generators give identical masks (common random numbers for old,
reference and current policy).
"""

from dllm_rl.estimators.base import (
    ESTIMATORS,
    PLANNERS,
    Estimator,
    MaskedRows,
    ScoringBatch,
    TokenScores,
    estimate,
    estimator_forwards,
    estimator_options,
    score_rows,
)
from dllm_rl.estimators.elbo import elbo, plan_elbo
from dllm_rl.estimators.mean_field import mean_field, plan_mean_field
from dllm_rl.estimators.random_mask import coupled, plan_coupled, plan_random_mask, random_mask
from dllm_rl.estimators.trace import merged_steps, plan_trace, trace

__all__ = [
    "ESTIMATORS", "PLANNERS", "Estimator", "MaskedRows", "ScoringBatch", "TokenScores", "coupled", "elbo",
    "estimate", "estimator_forwards", "estimator_options", "mean_field", "merged_steps", "plan_coupled",
    "plan_elbo", "plan_mean_field", "plan_random_mask", "plan_trace", "random_mask", "score_rows", "trace",
]
