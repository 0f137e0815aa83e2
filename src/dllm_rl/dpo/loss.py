"""VRPO's DPO loss on ELBOs (LLaDA 1.5, arXiv 2505.19223, the DPO-E objective):

    L = - log sigma( beta * ( [B_theta(y_w) - B_ref(y_w)] - [B_theta(y_l) - B_ref(y_l)] ) / c )

``B`` is the ELBO estimate (``vrpo`` estimator, its ``sequence_score()``), ``y_w`` the chosen and ``y_l`` the
rejected response; averaged over the pairs. ``c`` (``elbo_divisor``, default 1: the paper's form) divides every ELBO:
the published re-implementation (DARE ``compute_dpo_loss``) divides by the padded response length (512), i.e.
``beta_eff = beta / 512``. No KL, no clipping, no SFT term: the reference enters through the logits only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DPOOutput:
    loss: torch.Tensor  # scalar, float32
    chosen_reward: torch.Tensor  # [B]: beta * (B_theta(y_w) - B_ref(y_w)) / c, no gradient
    rejected_reward: torch.Tensor  # [B]

    def metrics(self) -> dict[str, float]:
        """The implicit rewards' means, their margin and how often the chosen one is higher (DPO's reward accuracy)."""
        margin = self.chosen_reward - self.rejected_reward
        return {"dpo_chosen_reward": float(self.chosen_reward.mean()),
                "dpo_rejected_reward": float(self.rejected_reward.mean()),
                "dpo_margin": float(margin.mean()), "dpo_accuracy": float((margin > 0).float().mean())}


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, elbo_divisor: float = 1.0) -> DPOOutput:
    """VRPO's DPO-E loss (module docstring) from per-pair ELBOs, each ``[B]``; float32 whatever the inputs."""
    pc, pr = policy_chosen.float(), policy_rejected.float()
    rc, rr = ref_chosen.detach().float(), ref_rejected.detach().float()
    chosen = beta * (pc - rc) / elbo_divisor
    rejected = beta * (pr - rr) / elbo_divisor
    loss = -F.logsigmoid(chosen - rejected).mean()
    return DPOOutput(loss, chosen.detach(), rejected.detach())
