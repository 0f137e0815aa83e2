"""The RL methods beyond the founding presets, one module each, and the tables every method draws from.

A method is a composition: estimator (a row planner, ``@register`` in :mod:`dllm_rl.estimators.registry`)
+ policy loss (``@register_loss``, :mod:`dllm_rl.rl.losses`) + KL (:mod:`dllm_rl.rl.kl`) + advantage rule
(``@register_advantage``, :mod:`dllm_rl.rl.advantages`) + optional rollout hook (``@register_hook``,
:mod:`dllm_rl.rl.hooks`). **Adding a method** is one module here that registers the parts it lacks, its
import below, and its entry in :data:`dllm_rl.rl.algorithms.PRESETS`.

Importing this package registers every part; the tables below are the complete registries (the config
checks read them from here).
"""

from dllm_rl.estimators import ESTIMATORS
from dllm_rl.rl.advantages import ADVANTAGES
from dllm_rl.rl.hooks import ROLLOUT_HOOKS
from dllm_rl.rl.kl import KL_ESTIMATORS
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.methods import bgpo, igpo, justgrpo, spg, wd1  # noqa: F401  (each registers its parts)

__all__ = ["ADVANTAGES", "ESTIMATORS", "KL_ESTIMATORS", "POLICY_LOSSES", "ROLLOUT_HOOKS"]
