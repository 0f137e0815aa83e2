"""``rollout.decoding: learned``: DiFFPO's per-prompt threshold (arXiv 2510.02212) trained jointly with the policy.

The controller and its maths are :mod:`dllm_rl.sampling.threshold_head`; this is its place in the RL loop. Each
round, :meth:`ThresholdLearner.draw` gives every sample a threshold drawn from the head (one draw per sample, from
the sample's own seed, so a group's samples decode at different speeds) and remembers the draw; after the step's
advantages, :meth:`ThresholdLearner.update` takes one Adam step on the REINFORCE loss ``-mean A_i log pi(z_i | c_i)``
over the samples that train, the same advantages the policy's loss uses (so a speed term of ``reward.terms`` is what
teaches the head to go faster, and the task term to stay right). The head starts from the one saved next to
``model.path`` when there is one (a run continuing a learned run), else at the middle of ``rollout.learned_range``;
checkpoints and ``final/`` carry it, and a resumed run reloads it. (No equation numbers: what was checked of the
paper and why none is cited is in :mod:`dllm_rl.sampling.threshold_head`.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from dllm_rl.config import ConfigError
from dllm_rl.sampling.threshold_head import (
    HEAD_FILE,
    ThresholdHead,
    load_head,
    policy_gradient_loss,
    prompt_features,
    prompt_thresholds,
)

#: the draws' seeds are the samples' own, moved off the sampler's streams
DRAW_SALT = 0x5EED7


def check_learned(cfg) -> None:
    """The rules of ``rollout.decoding: learned`` against the rest of an RL config."""
    r = cfg.rollout
    if r.decoding != "learned":
        return
    if len(r.learned_range) != 2 or not 0 < r.learned_range[0] < r.learned_range[1] <= 1:
        raise ConfigError(f"rollout.learned_range: need [t_min, t_max] with 0 < t_min < t_max <= 1, got "
                          f"{r.learned_range}")
    if r.steps is not None or r.threshold is not None:
        raise ConfigError("rollout.decoding=learned chooses each prompt's threshold: drop rollout.steps and "
                          "rollout.threshold")
    if cfg.rollout_hook is not None:
        raise ConfigError(f"rollout.decoding=learned: the rollout hook {cfg.rollout_hook!r} replaces or retrains "
                          "rollouts; the learned threshold trains on the sampler's own samples only")


class ThresholdLearner:
    """The head, its optimiser and the step's draws (see the module docstring)."""

    def __init__(self, cfg, model):
        r = cfg.rollout
        start = Path(str(cfg.model.path))
        if (start / HEAD_FILE).is_file():
            self.head = load_head(start)
        else:
            self.head = ThresholdHead(int(model.config.hidden_size), r.learned_range[0], r.learned_range[1],
                                      r.learned_sigma)
        self.optimizer = torch.optim.Adam(self.head.parameters(), lr=r.learned_lr)
        self.features: list[torch.Tensor] = []
        self.z: list[torch.Tensor] = []

    def reset(self) -> None:
        """Forget the draws (a new step)."""
        self.features, self.z = [], []

    def draw(self, policy, prompt_ids: list[list[int]], seeds: list[int], group: int) -> list[float]:
        """One threshold per sample of the round: ``prompt_ids`` one per prompt, each repeated ``group`` times in
        the rollout; ``seeds`` per sample."""
        feats = prompt_features(policy, prompt_ids).repeat_interleave(group, 0)
        gens = [torch.Generator().manual_seed(int(s) ^ DRAW_SALT) for s in seeds]
        thresholds, z = prompt_thresholds(self.head, feats, gens)
        self.features.append(feats)
        self.z.append(z)
        return thresholds

    def update(self, advantages: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
        """One step on the kept samples' REINFORCE loss; the step's metrics (mean threshold drawn, loss)."""
        feats, z = torch.cat(self.features), torch.cat(self.z)
        metrics = {"learned_threshold": float(self.head.threshold(z).mean())}
        if advantages.dim() != 1 or len(keep) == 0:
            return metrics
        self.optimizer.zero_grad(set_to_none=True)
        loss = policy_gradient_loss(self.head, feats[keep], z[keep], advantages[keep].detach().cpu())
        loss.backward()
        self.optimizer.step()
        metrics["learned_threshold_loss"] = float(loss.detach())
        return metrics

    def save(self, directory) -> None:
        self.head.save(directory)

    def load(self, directory) -> None:
        """The head of a checkpoint (a resumed run); none there: keep the current one."""
        if (Path(directory) / HEAD_FILE).is_file():
            self.head.load_state_dict(load_head(directory).state_dict())


__all__ = ["ThresholdLearner", "check_learned"]
