"""Speed as a reward: LightningRL (Hu et al., arXiv 2603.13319), with its speed counted only where the answer is right.

A rollout reports each answer's forward passes (``Rollout.nfe``) and tokens per forward (TPF,
:meth:`~dllm_rl.sampling.Rollout.tokens_per_forward`); the reward receives them as the ``nfe`` and ``tpf`` columns
(:func:`dllm_rl.rl.collect.rollout_columns`). Three parts, each one switch of the config:

- **a speed term** of ``reward.terms`` (``{speed: tpf | per_pass | per_token, weight: W}``, :class:`SpeedReward`):
  ``tpf`` is the answer's tokens per forward pass, ``L / NFE`` (LightningRL's speed reward, Sec. 3.3 and App. B.1);
  ``per_pass`` is ``1 / NFE``, the inverse of the passes spent (no credit for a longer answer at equal passes);
  ``per_token`` is ``max(0, 1 - NFE / L)``, the share of the one-pass-per-token budget the answer did not need.
  Every kind is 0 or more and grows with speed, and :class:`~dllm_rl.rewards.reward_terms.CombinedReward` sets it to 0
  where the answer is not right (a task term below 1), so a wrong answer's speed value is never above a right one's:
  speed cannot be bought with wrong answers, under the plain sum and under the decoupled normalisation alike. (The
  paper rewards every sample's TPF and filters all-wrong groups out instead, Sec. 3.3; the gate keeps that
  protection without the filter.)
- **decoupled normalisation** (``reward.normalization: decoupled``,
  :func:`~dllm_rl.rl.advantages.decoupled_advantages`): each term's values normalised within the group on their
  own (Eq. 5, the run's advantage rule applied to that term alone), weighted and summed (Eq. 6, with the terms'
  weights; the paper's are 1), and the sum normalised over the batch (Eq. 7). Unlike the paper, which leaves the
  accuracy reward raw (Sec. 3.1), every term is normalised, as the issue asks and the weights then set the balance.
- **TPF-aware filtering** (``tpf_spread: delta``, :func:`~dllm_rl.rl.advantages.group_filter`): a group trains only
  when its TPF spread ``max_j TPF - min_j TPF >= delta`` (Eq. 11) and at least one of its answers is right; with
  ``dynamic_sampling`` further prompts are rolled out until enough groups pass. A group whose answers are all right
  keeps its signal when their speeds differ: the gated speed term makes its rewards differ.

The section and equation numbers (Sec. 3.1, 3.3, App. B.1; Eq. 5-7, 11) are those of the paper's v1 as first read
and are NOT verified: the stored copies of the v1 HTML page and its mirrors reach only the abstract and introduction,
and a later version exists whose numbering may differ. Hand computations: ``tests/rl/test_speed.py``
(``test_speed_kinds_and_rollout_columns``, ``test_decoupled_advantages_match_a_hand_computation``,
``test_a_fast_wrong_answer_scores_below_a_slow_right_one``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dllm_rl.config import ConfigError

#: the speed kinds of a ``{speed: KIND}`` term
SPEEDS = ("tpf", "per_pass", "per_token")


def speed_value(kind: str, tokens: int, nfe: int) -> float:
    """One answer's speed of ``kind`` (see the module docstring) from its ``tokens`` and forward passes ``nfe``; 0
    for an answer without a token or a pass."""
    if tokens <= 0 or nfe <= 0:
        return 0.0
    if kind == "tpf":
        return tokens / nfe
    if kind == "per_pass":
        return 1.0 / nfe
    if kind == "per_token":
        return max(0.0, 1.0 - nfe / tokens)
    raise ValueError(f"unknown speed {kind!r}; choose one of {', '.join(SPEEDS)}")


class SpeedReward:
    """A ``{speed: KIND}`` term: the TRL-signature reward of each completion's speed, read from the rollout's
    ``completion_ids`` (its answer's tokens) and ``nfe`` columns. ``gated``: the combined reward keeps it only where
    the task terms say the answer is right."""

    gated = True

    def __init__(self, kind: str, key: str = "reward.terms"):
        if kind not in SPEEDS:
            raise ConfigError(f"{key}: unknown speed {kind!r}; choose one of {', '.join(SPEEDS)}")
        self.kind, self.key = kind, key
        self.__name__ = f"speed_{kind}"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], *, completion_ids=None, nfe=None,
                 **columns: Any) -> list[float]:
        if nfe is None or completion_ids is None:
            raise ValueError(f"{self.key}: a speed term needs the rollout's nfe and completion_ids columns (it "
                             "scores rollouts of the RL loop only)")
        return [speed_value(self.kind, len(ids), int(n)) for ids, n in zip(completion_ids, nfe)]


def gate(values: list[float], right: list[bool]) -> list[float]:
    """``values`` where the answer is ``right``, else 0 (a speed term's floor)."""
    return [v if ok and math.isfinite(v) else 0.0 for v, ok in zip(values, right)]


def check_speed_config(cfg: Any) -> None:
    """The rules between the speed settings and the rest of an RL config: the decoupled normalisation reads each
    term's values as the reward gave them, which a rollout hook's replaced samples or the value model's token
    advantages would not use."""
    if cfg.reward.normalization != "decoupled":
        return
    if cfg.rollout_hook not in (None, "off"):
        raise ConfigError(f"reward.normalization: decoupled normalises the terms of the rollouts as the reward scored "
                          f"them; the {cfg.rollout_hook!r} rollout hook replaces samples or advantages. Use "
                          "reward.normalization=sum, or rollout_hook=off")
    if cfg.value_model.enabled:
        raise ConfigError("reward.normalization: decoupled makes sequence advantages, which the value model's token "
                          "advantages replace; use reward.normalization=sum with value_model.enabled")
