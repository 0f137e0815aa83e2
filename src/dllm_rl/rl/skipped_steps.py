"""Steps without an update: counted in a row, a warning at each saying why, and a stop at ``train.max_skipped_steps``
(a run that never updates would otherwise end as a success). Why: no group had reward signal (all-equal rewards,
outside ``accuracy_band``), or a selecting advantage rule (RAFT's) accepted none of the kept groups' samples."""

from __future__ import annotations

import logging

from dllm_rl.rl.advantages import ADVANTAGES
from dllm_rl.rl.config import RLConfig
from dllm_rl.training.finite import TrainingStopped

logger = logging.getLogger(__name__)


def count_skipped(cfg: RLConfig, skipped: int, any_kept: bool, step_idx: int, filt, rejected: int,
                  group_size: int) -> int:
    """The steps in a row without an update after step ``step_idx`` (``skipped`` before it; ``any_kept``: some
    rank kept a sample to train on); warns when this one had none and raises :class:`TrainingStopped` at
    ``train.max_skipped_steps``. ``filt``: the step's group filter; ``rejected``: the samples of the kept groups that
    a selecting advantage rule turned away; ``group_size``: samples per prompt."""
    if any_kept:
        return 0
    skipped += 1
    what, why, hint = _reason(cfg, filt, rejected, group_size)
    limit = (f"the run stops at {cfg.train.max_skipped_steps}" if cfg.train.max_skipped_steps
             else "train.max_skipped_steps=0")
    logger.warning("step %d: no update, %s (%s); %d step(s) in a row (%s)", step_idx + 1, what, why, skipped, limit)
    if cfg.train.max_skipped_steps and skipped >= cfg.train.max_skipped_steps:
        raise TrainingStopped(f"stopping at step {step_idx + 1}: {skipped} steps in a row were skipped, {what} "
                              f"({why}); {hint}, or set train.max_skipped_steps=0 to go on")
    return skipped


def _reason(cfg: RLConfig, filt, rejected: int, group_size: int) -> tuple[str, str, str]:
    """What a step without an update lacked, why, and what to check: no group with reward signal, or (a selecting
    rule such as RAFT) groups kept but none of their samples accepted."""
    if rejected:  # groups passed the filter, the rule accepted none of their samples
        opts = cfg.advantage_options or "its defaults"
        return (f"advantage {cfg.advantage!r} accepted no sample",
                f"it turned away all {rejected} samples of the groups kept, with advantage_options {opts}",
                f"check advantage_options against the rewards in rollouts.jsonl ({cfg.advantage} accepts "
                f"{ADVANTAGES[cfg.advantage].selects})")
    why = f"{filt.zero_variance_groups} of {len(filt.keep) // group_size} groups had all-equal rewards"
    if filt.out_of_band_groups:
        why += f", {filt.out_of_band_groups} were outside accuracy_band"
    hint = ("rollout.temperature=0 decodes every sample of a prompt alike: raise it" if cfg.rollout.temperature == 0
            else "check the rollouts (rollouts.jsonl) for a reward that does not vary or a policy collapsed by too "
            f"large a learning rate (optim.lr={cfg.optim.lr:g})")
    return "no group had reward signal", why, hint
