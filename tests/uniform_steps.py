"""A scripted two-step record of the uniform-state sampler, for the hand computations of its log-probabilities (the
sampler's own, tests/sampling, and the trajectory estimator's, tests/estimators): two rows, one canvas of 4; step 1
(schedule step 2, no self-conditioning) accepts positions 0-1 of row 0 and position 0 of row 1; step 2 (schedule
step 1, self-conditioned) accepts positions 2-3 of row 0, and row 1 has stopped before it."""

from __future__ import annotations

import torch

from dllm_rl.sampling.uniform import UniformStep


def two_step_record() -> list[UniformStep]:
    return [
        UniformStep(0, 2, torch.zeros(2, 4, dtype=torch.long), False, torch.tensor([[0, 1, 0, 2], [0, 0, 0, 0]]),
                    torch.tensor([[True, True, False, False], [True, False, False, False]]),
                    torch.tensor([False, False]), torch.tensor([False, False])),
        UniformStep(0, 1, torch.zeros(2, 4, dtype=torch.long), True, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
                    torch.tensor([[False, False, True, True], [True, True, True, True]]),
                    torch.tensor([False, True]), torch.tensor([False, False])),
    ]
