"""Log-likelihood estimators for diffusion LMs: ``trace``, ``elbo``, ``mean_field``, ``random_mask``, ``coupled``,
``block``, ``ar``, ``spg_block``, ``left_to_right``, ``one_step``, ``ebpo_block``, ``egspo_steps``,
``tree_segment`` and ``vrpo``; for uniform-state families (DiffusionGemma, no mask token) ``trajectory``,
``uniform_elbo`` and ``uniform_denoise``, scorers that decode canvas by canvas (:mod:`~dllm_rl.estimators.canvases`).

An estimator is one *row planner* registered by name in :data:`ESTIMATORS` (verl's ``core_algos`` style,
:mod:`~dllm_rl.estimators.registry`); :func:`estimate` plans the rows with it and scores them with the one
shared row scorer (:mod:`~dllm_rl.estimators.scoring`). The only randomness is the passed
``torch.Generator``: identically seeded generators give identical masks (common random numbers for old,
reference and current policy).

Modules: :mod:`~dllm_rl.estimators.batch` (``ScoringBatch``, ``MaskedRows``, ``TokenScores``),
:mod:`~dllm_rl.estimators.rows` (random draws and row building), :mod:`~dllm_rl.estimators.scoring`,
:mod:`~dllm_rl.estimators.registry`, and one module per estimator (each registers its planner when imported).
"""

from dllm_rl.estimators.ar import plan_ar
from dllm_rl.estimators.batch import MaskedRows, ScoringBatch, TokenScores
from dllm_rl.estimators.block import plan_block
from dllm_rl.estimators.coupled import plan_coupled
from dllm_rl.estimators.ebpo_block import plan_ebpo_block
from dllm_rl.estimators.egspo_steps import plan_egspo_steps
from dllm_rl.estimators.elbo import plan_elbo
from dllm_rl.estimators.left_to_right import plan_left_to_right
from dllm_rl.estimators.mean_field import plan_mean_field
from dllm_rl.estimators.one_step import plan_one_step
from dllm_rl.estimators.random_mask import plan_random_mask
from dllm_rl.estimators.registry import (
    ESTIMATORS,
    NOISE,
    Planner,
    check_noise,
    estimate,
    estimator_forwards,
    estimator_options,
    plan_rows,
    register,
    register_uniform,
)
from dllm_rl.estimators.scoring import score_rows
from dllm_rl.estimators.spg_block import plan_spg_block
from dllm_rl.estimators.trace import merged_steps, plan_trace
from dllm_rl.estimators.trajectory import score_trajectory
from dllm_rl.estimators.tree_segment import plan_tree_segment
from dllm_rl.estimators.uniform_denoise import score_uniform_denoise
from dllm_rl.estimators.uniform_elbo import score_uniform_elbo
from dllm_rl.estimators.vrpo import plan_vrpo

__all__ = [
    "ESTIMATORS", "MaskedRows", "Planner", "ScoringBatch", "TokenScores", "estimate", "estimator_forwards",
    "estimator_options", "merged_steps", "plan_ar", "plan_block", "plan_coupled", "plan_ebpo_block", "plan_egspo_steps",
    "plan_elbo", "plan_left_to_right", "plan_mean_field", "plan_one_step", "plan_random_mask", "plan_rows",
    "plan_spg_block", "plan_trace", "plan_tree_segment", "plan_vrpo", "register", "score_rows", "NOISE", "check_noise",
    "register_uniform", "score_trajectory", "score_uniform_denoise", "score_uniform_elbo",
]
