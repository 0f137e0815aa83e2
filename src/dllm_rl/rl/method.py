"""What a method is: one module of :mod:`dllm_rl.rl.methods` that declares ``METHOD = Method(...)``.

A method is a composition: an estimator (a row planner in :mod:`dllm_rl.estimators`), a policy loss
(``@register_loss``, :mod:`dllm_rl.rl.losses`), a KL estimator (:mod:`dllm_rl.rl.kl`, added by the trainer at the
level the loss declares), an advantage rule (``@register_advantage``, :mod:`dllm_rl.rl.advantages`) and an
optional rollout hook (``@register_hook``, :mod:`dllm_rl.rl.hooks`). Its :class:`Method` says which (the
*preset*: the config fields it fills when a user leaves them unset), where it comes from (the paper) and how to
run it at scale (its recipe in ``configs/``). Everything that lists the methods is derived from these
declarations: ``PRESETS`` and the preset table of ``--help-config`` (:mod:`dllm_rl.rl.algorithms`), the
"Preset:" clauses of the config help, the README's preset table and the tests' recipe list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The fields every preset fills (each a method field of ``RLConfig``).
PRESET_KEYS = ("estimator", "estimator_options", "loss_type", "loss_aggregation", "beta", "kl_estimator",
               "advantage", "scale_rewards", "estimator_noise")
#: The fields a preset may fill besides (their config defaults otherwise).
OPTIONAL_KEYS = ("loss_options", "rollout_hook", "rollout_hook_options", "inpaint_entropy_keep")
#: The words a method may add to its row of the preset table, by column.
NOTE_COLUMNS = ("estimator", "loss", "hook")


@dataclass(frozen=True)
class Method:
    """One RL method: ``name`` (the ``algorithm=`` value; its module's name), ``paper`` ("NAME, arXiv ID"),
    ``preset`` (the config fields it fills: every key of :data:`PRESET_KEYS`, any of :data:`OPTIONAL_KEYS`),
    ``recipe`` (its file in ``configs/``: the paper's settings that a preset cannot hold, such as the learning
    rate and lengths) and ``notes`` (a few words per preset-table column of :data:`NOTE_COLUMNS`)."""

    name: str
    paper: str
    preset: Mapping[str, Any]
    recipe: str
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [k for k in PRESET_KEYS if k not in self.preset]
        unknown = sorted(set(self.preset) - set(PRESET_KEYS) - set(OPTIONAL_KEYS))
        if missing or unknown:
            raise ValueError(f"method {self.name!r}: its preset lacks {missing} / has unknown keys {unknown}; a preset "
                             f"fills {', '.join(PRESET_KEYS)} and may fill {', '.join(OPTIONAL_KEYS)}")
        bad_notes = sorted(set(self.notes) - set(NOTE_COLUMNS))
        if bad_notes:
            raise ValueError(f"method {self.name!r}: notes for unknown columns {bad_notes}; columns: "
                             f"{', '.join(NOTE_COLUMNS)}")
        if any("|" in text for text in (self.paper, *self.notes.values())):
            raise ValueError(f"method {self.name!r}: its paper and notes are cells of the README's preset table and "
                             "cannot hold '|'")
        if not self.recipe.endswith(".yaml") or "/" in self.recipe:
            raise ValueError(f"method {self.name!r}: recipe is a file name in configs/ ending in .yaml, got "
                             f"{self.recipe!r}")
