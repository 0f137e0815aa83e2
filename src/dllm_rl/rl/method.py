"""What a method is: one module of :mod:`dllm_rl.rl.methods` that declares ``METHOD = Method(...)``.

A method is a composition: an estimator (a row planner in :mod:`dllm_rl.estimators`), a policy loss
(``@register_loss``, :mod:`dllm_rl.rl.losses`), a KL estimator (:mod:`dllm_rl.rl.kl`, added by the trainer at the
level the loss declares), an advantage rule (``@register_advantage``, :mod:`dllm_rl.rl.advantages`) and an
optional rollout hook (``@register_hook``, :mod:`dllm_rl.rl.hooks`). Its :class:`Method` says which (the
*preset*, a typed :class:`Preset`: the config fields it fills when a user leaves them unset, the clip range
included), where it comes from (the paper) and how to run it at scale (its recipe in ``configs/``). What its parts
are (a loss's KL level, whether it has a ratio, a hook's needs) is declared where each part is registered, as typed
fields (:class:`~dllm_rl.rl.losses.PolicyLoss`, :class:`~dllm_rl.rl.hooks.RolloutHook`). Everything that lists the
methods is derived from these declarations: ``PRESETS``, the preset table of ``--help-config`` and the table of
``docs/methods.md`` (:mod:`dllm_rl.rl.presets`, written by ``make docs``), the "Preset:" clauses of the config help
and the tests' lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: The words a method may add to its row of the preset table, by column.
NOTE_COLUMNS = ("estimator", "loss", "hook")


@dataclass(frozen=True)
class Preset:
    """The config fields a method fills when a user leaves them unset (each a field of ``RLConfig`` with the same
    name and meaning; their help says what each is). The first eight are every method's choice; the others have
    the values most methods use: no loss options or hook, every inpainted token trains, and PPO's clip range
    ``[1 - epsilon, 1 + epsilon_high]`` (``epsilon_high`` None: ``epsilon``; DAPO's clip-higher sets it)."""

    estimator: str
    loss_type: str
    loss_aggregation: Literal["token_mean", "seq_mean", "fixed_length"]
    beta: float
    kl_estimator: str
    advantage: str
    scale_rewards: Literal["group", "batch", "none"]
    estimator_noise: Literal["sample", "group"]
    estimator_options: Mapping[str, Any] = field(default_factory=dict)
    loss_options: Mapping[str, Any] | None = None
    rollout_hook: str | None = None
    rollout_hook_options: Mapping[str, Any] | None = None
    inpaint_entropy_keep: float | None = None
    epsilon: float = 0.2
    epsilon_high: float | None = None

    def fields(self) -> dict[str, Any]:
        """The fields as ``{config key: value}`` (mappings copied to dicts), in declaration order."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


@dataclass(frozen=True)
class Method:
    """One RL method: ``name`` (the ``algorithm=`` value; its module's name), ``paper`` ("NAME, arXiv ID"),
    ``preset`` (the :class:`Preset` it fills), ``recipe`` (its file in ``configs/``: the paper's settings that a
    preset cannot hold, such as the learning rate and lengths) and ``notes`` (a few words per preset-table column of
    :data:`NOTE_COLUMNS`)."""

    name: str
    paper: str
    preset: Preset
    recipe: str
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.preset, Preset):
            raise TypeError(f"method {self.name!r}: preset is a Preset(...) (dllm_rl.rl.method), got "
                            f"{type(self.preset).__name__}")
        bad_notes = sorted(set(self.notes) - set(NOTE_COLUMNS))
        if bad_notes:
            raise ValueError(f"method {self.name!r}: notes for unknown columns {bad_notes}; columns: "
                             f"{', '.join(NOTE_COLUMNS)}")
        if any("|" in text for text in (self.paper, *self.notes.values())):
            raise ValueError(f"method {self.name!r}: its paper and notes are cells of the preset table and "
                             "cannot hold '|'")
        if not self.recipe.endswith(".yaml") or "/" in self.recipe:
            raise ValueError(f"method {self.name!r}: recipe is a file name in configs/ ending in .yaml, got "
                             f"{self.recipe!r}")
