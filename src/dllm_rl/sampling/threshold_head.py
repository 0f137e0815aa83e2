"""A learned decoding policy: DiFFPO's per-prompt confidence threshold (Zhao et al., arXiv 2510.02212).

DiFFPO (Sec. 4, "training samplers") makes the dynamic schedule's threshold a policy of its own: for each prompt
``c`` a small controller chooses the threshold the sampler decodes that prompt with, and RL trains it on the reward
of the answer (task reward plus a speed term), jointly with the model. The paper's pieces, as built here:

- **the controller** ``pi_phi(tau | c)``: a linear layer on the prompt's mean last hidden state ``h(c)`` (the
  model's own features, no gradient into the model) gives the mean ``mu = w . h + b`` of a normal draw
  ``z ~ N(mu, sigma^2)`` (``sigma`` fixed); the threshold is ``tau = t_min + (t_max - t_min) * sigmoid(z)``, a
  logit-normal draw in ``(t_min, t_max)``. Its log-probability is the normal's, ``log N(z; mu, sigma^2)`` (the
  change of variables from ``z`` to ``tau`` adds a term free of ``phi``, so the gradient is the same);
- **the rollout**: each sample of a group draws its own ``z`` (so a group's samples differ in speed as well as in
  tokens) and is decoded with the dynamic schedule at its ``tau`` (:func:`prompt_thresholds`, fed to the sampler as
  each request's own :class:`~dllm_rl.sampling.config.DecodeConfig`);
- **the update**: the REINFORCE term of the joint objective, ``-mean_i A_i log pi_phi(z_i | c_i)`` over the samples
  that train, with the same group advantages ``A_i`` the model's loss uses (:func:`policy_gradient_loss`);
- **inference** (``--decoding learned``): the controller's mean, ``z = mu``, one deterministic threshold per prompt.

No equation numbers are cited because none could be verified: checked were the stored copies of the arXiv abstract
(2510.02212), its NeurIPS 2025 abstract page and third-party summaries, none of which shows the method section's
equations. This follows the paper's description (a per-prompt threshold, sampled during RL, a reward with an NFE
term, a policy gradient on the controller). Third-party summaries say the paper's sampler is the Entropy-Bounded
sampler, whose threshold bounds each token's predictive entropy; the threshold here is the project's dynamic
schedule's confidence threshold (unverified against the paper's text, and a difference if the summaries are right).
Hand computation: ``tests/sampling/test_threshold_head.py::test_log_prob_gradient_and_threshold_by_hand``. The head
is saved next to the model as :data:`HEAD_FILE` (safetensors) and :data:`HEAD_CONFIG` (its range and width).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from dllm_rl.errors import UserError

HEAD_FILE = "threshold_head.safetensors"
HEAD_CONFIG = "threshold_head.json"


class ThresholdHead(nn.Module):
    """``hidden -> mu`` (a linear layer, zero-initialised: every prompt starts at the middle of the range) and the
    fixed spread ``sigma`` of the logit-normal draw; ``t_min < t_max`` bound the threshold."""

    def __init__(self, hidden: int, t_min: float = 0.5, t_max: float = 1.0, sigma: float = 0.5):
        super().__init__()
        if not 0 < t_min < t_max <= 1:
            raise UserError(f"threshold head: need 0 < t_min < t_max <= 1, got t_min={t_min}, t_max={t_max}")
        if sigma <= 0:
            raise UserError(f"threshold head: sigma must be > 0, got {sigma}")
        self.hidden, self.t_min, self.t_max, self.sigma = int(hidden), float(t_min), float(t_max), float(sigma)
        self.linear = nn.Linear(self.hidden, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def mean(self, features: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` prompt features -> ``[n]`` means ``mu`` of ``z``."""
        return self.linear(features.float()).squeeze(-1)

    def threshold(self, z: torch.Tensor) -> torch.Tensor:
        """``tau = t_min + (t_max - t_min) * sigmoid(z)``."""
        return self.t_min + (self.t_max - self.t_min) * torch.sigmoid(z)

    def log_prob(self, features: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``log N(z; mu(features), sigma^2)`` per row (differentiable in the head's weights)."""
        mu = self.mean(features)
        return -0.5 * ((z - mu) / self.sigma) ** 2 - math.log(self.sigma) - 0.5 * math.log(2 * math.pi)

    @torch.no_grad()
    def draw(self, features: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One ``z`` per row, ``mu + sigma * eps`` with ``eps`` from ``generator`` (None: the mean, no noise)."""
        mu = self.mean(features)
        if generator is None:
            return mu
        eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device="cpu").to(mu.device)
        return mu + self.sigma * eps

    def save(self, directory: str | Path) -> None:
        """Write :data:`HEAD_FILE` and :data:`HEAD_CONFIG` into ``directory`` (next to a saved model)."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(out / HEAD_FILE))
        (out / HEAD_CONFIG).write_text(json.dumps({"hidden": self.hidden, "t_min": self.t_min, "t_max": self.t_max,
                                                   "sigma": self.sigma}, indent=1) + "\n")


def load_head(directory: str | Path, asked: str = "--decoding learned") -> ThresholdHead:
    """The threshold head saved in ``directory``; a :class:`UserError` (one line naming ``asked``, the key that
    asked for it) when it has none."""
    from safetensors.torch import load_file

    d = Path(directory)
    if not (d / HEAD_FILE).is_file() or not (d / HEAD_CONFIG).is_file():
        raise UserError(f"{d}: no learned threshold head ({HEAD_FILE}); {asked} needs a checkpoint "
                        "saved by an RL run with rollout.decoding=learned")
    cfg = json.loads((d / HEAD_CONFIG).read_text())
    head = ThresholdHead(cfg["hidden"], cfg["t_min"], cfg["t_max"], cfg["sigma"])
    head.load_state_dict(load_file(str(d / HEAD_FILE)))
    return head


@torch.no_grad()
def prompt_features(model, prompts: list[list[int]]) -> torch.Tensor:
    """``[n, hidden]`` float32: each prompt's last hidden state averaged over its tokens, one prompt per forward (no
    padding to mask), under the model's stock forward."""
    rows = []
    for ids in prompts:
        x = torch.tensor([ids], dtype=torch.long, device=model.device)
        out = model.causal_lm(input_ids=x, output_hidden_states=True, logits_to_keep=1)
        rows.append(out.hidden_states[-1][0].float().mean(0))
    return torch.stack(rows).cpu()


def prompt_thresholds(head: ThresholdHead, features: torch.Tensor,
                      generators: list[torch.Generator] | None = None) -> tuple[list[float], torch.Tensor]:
    """Each row's threshold and its ``z``: the head's mean (``generators`` None: inference) or one draw per row from
    that row's generator (RL rollouts)."""
    if generators is None:
        z = head.draw(features)
    else:
        z = torch.cat([head.draw(features[i:i + 1], g) for i, g in enumerate(generators)])
    return [float(t) for t in head.threshold(z)], z


def policy_gradient_loss(head: ThresholdHead, features: torch.Tensor, z: torch.Tensor,
                         advantages: torch.Tensor) -> torch.Tensor:
    """The controller's REINFORCE loss, ``-mean_i A_i log pi_phi(z_i | c_i)`` (its gradient is the policy gradient
    of the expected advantage)."""
    return -(advantages.float() * head.log_prob(features, z)).mean()


__all__ = ["HEAD_CONFIG", "HEAD_FILE", "ThresholdHead", "load_head", "policy_gradient_loss", "prompt_features",
           "prompt_thresholds"]
