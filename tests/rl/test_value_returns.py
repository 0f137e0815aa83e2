"""Returns, GAE token advantages, whitening, process rewards and the clipped value loss on hand-built traces;
every expected number below is worked out by hand in the comments."""

import pytest
import torch

from dllm_rl.rl.returns import (
    clipped_value_loss,
    outcome_step_rewards,
    process_step_rewards,
    step_means,
    step_ranks,
    step_returns,
    token_returns_advantages,
    whiten,
)


# one completion of 5 tokens decoded in 3 steps: tokens 0, 1 at step 0, token 2 at step 1, token 3 at step 2;
# token 4 is EOS padding (not counted). Values V_j read at each token's commit state.
def _close(actual, expected):
    torch.testing.assert_close(actual.float(), torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-6)


KEY = torch.tensor([[7, 7, 9, 12, 3]])  # decoding-order step ids (any increasing ids)
COUNTED = torch.tensor([[True, True, True, True, False]])
V = torch.tensor([[0.2, 0.4, 0.5, 0.8, 9.0]])


def _ranks():
    rank, num = step_ranks(KEY, COUNTED)
    assert rank.tolist() == [[0, 0, 1, 2, -1]] and num.tolist() == [3]
    return rank, num


def test_step_values_are_the_mean_token_value_of_each_step():
    rank, _ = _ranks()
    _close(step_means(V, rank, 3), [[0.3, 0.5, 0.8]])  # (0.2+0.4)/2, 0.5, 0.8


# (gamma, lam) -> (step returns R*, token advantages A_j of tokens 0..3). Outcome reward 1 on step 2, so
# r* = [0, 0, 1], V* = [0.3, 0.5, 0.8];  delta_t = r*_t - V*_t + gamma V*_{t+1}; A*_t = delta_t + gamma lam A*_{t+1};
# A_j = r*_t - V_j + gamma V*_{t+1} + gamma lam A*_{t+1}.
CASES = {
    # gamma = lam = 1: R* = [1, 1, 1], A_j = R - V_j
    (1.0, 1.0): ([1.0, 1.0, 1.0], [0.8, 0.6, 0.5, 0.2]),
    # gamma 0.9: R* = [0.81, 0.9, 1]; lam 1 telescopes to A_j = R*_t - V_j
    (0.9, 1.0): ([0.81, 0.9, 1.0], [0.61, 0.41, 0.4, 0.2]),
    # lam 0.95: delta = [0.2, 0.3, 0.2]; A* = [., 0.3 + 0.95*0.2 = 0.49, 0.2];
    # A_0 = -0.2 + 0.5 + 0.95*0.49 = 0.7655, A_1 = 0.5655, A_2 = -0.5 + 0.8 + 0.95*0.2 = 0.49, A_3 = 0.2
    (1.0, 0.95): ([1.0, 1.0, 1.0], [0.7655, 0.5655, 0.49, 0.2]),
    # delta = [0.15, 0.22, 0.2]; A*_1 = 0.22 + 0.855*0.2 = 0.391; A_0 = -0.2 + 0.45 + 0.855*0.391 = 0.584305,
    # A_1 = 0.384305, A_2 = -0.5 + 0.72 + 0.855*0.2 = 0.391, A_3 = 0.2
    (0.9, 0.95): ([0.81, 0.9, 1.0], [0.584305, 0.384305, 0.391, 0.2]),
}


@pytest.mark.parametrize("gamma,lam", list(CASES))
def test_returns_and_advantages_by_hand(gamma, lam):
    rank, num = _ranks()
    step_r = outcome_step_rewards(torch.tensor([1.0]), num, 3)
    assert step_r.tolist() == [[0.0, 0.0, 1.0]]
    _close(step_returns(step_r, gamma), [CASES[(gamma, lam)][0]])
    ret, adv = token_returns_advantages(V, rank, num, step_r, gamma, lam)
    r_star = CASES[(gamma, lam)][0]
    _close(ret, [[r_star[0], r_star[0], r_star[1], r_star[2], 0.0]])
    _close(adv, [CASES[(gamma, lam)][1] + [0.0]])


def test_perfect_value_with_gamma_lam_one_gives_r_minus_v():
    """Two samples of unequal lengths in one batch, value = the true expected return 0.7 everywhere: A = R - V."""
    key = torch.tensor([[0, 1, 1, 2], [0, 0, 1, -1]])
    counted = key >= 0
    rank, num = step_ranks(key, counted)
    assert num.tolist() == [3, 2]
    values = torch.where(counted, 0.7, 0.0)
    rewards = torch.tensor([1.0, 0.0])
    ret, adv = token_returns_advantages(values, rank, num, outcome_step_rewards(rewards, num, 3))
    _close(ret, [[1.0] * 4, [0.0, 0.0, 0.0, 0.0]])
    _close(adv, [[0.3] * 4, [-0.7, -0.7, -0.7, 0.0]])


def test_a_process_reward_at_step_k_lands_at_step_k():
    rank, num = _ranks()
    step_r = process_step_rewards([[0.0, 0.5]], rank, rank, 3)  # score 0.5 for decoding step 1 only
    assert step_r.tolist() == [[0.0, 0.5, 0.0]]
    ret, adv = token_returns_advantages(torch.zeros_like(V), rank, num, step_r, 1.0, 1.0)
    # the reward is earned at step 1: tokens of steps 0 and 1 see it, the token of step 2 does not
    _close(ret, [[0.5, 0.5, 0.5, 0.0, 0.0]])
    _close(adv, [[0.5, 0.5, 0.5, 0.0, 0.0]])


def test_process_rewards_of_merged_decoding_steps_add_up():
    """shrinkage 2 merges decoding steps (0, 1) and (2): scores [0.25, 0.5, 1] -> merged [0.75, 1]."""
    raw_rank, _ = _ranks()
    merged_rank = torch.tensor([[0, 0, 0, 1, -1]])
    out = process_step_rewards([[0.25, 0.5, 1.0], None], torch.cat([raw_rank, raw_rank]),
                               torch.cat([merged_rank, merged_rank]), 2)
    assert out.tolist() == [[0.75, 1.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="sample 0: the reward gave 4 per-step scores for a rollout of 3 decoding"):
        process_step_rewards([[1.0, 1.0, 1.0, 1.0]], raw_rank, raw_rank, 3)


def test_whiten_over_the_masked_tokens_only():
    adv = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -4.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    out = whiten(adv, mask)  # mean 4, population std sqrt(5)
    s = 5 ** 0.5
    _close(out, [[-3 / s, -1 / s, 0.0], [1 / s, 3 / s, 0.0]])


def test_clipped_value_loss_by_hand():
    # token 0: V 0.5 from old 0 (clipped to 0.2), R 1: max(0.25, 0.64) = 0.64; token 1: V 0.1, old 0, R 1:
    # unclipped 0.81 = clipped 0.81; token 2 masked out. 0.5 * (0.64 + 0.81) / 2 = 0.3625
    values = torch.tensor([[0.5, 0.1, 7.0]])
    loss, frac = clipped_value_loss(values, torch.zeros(1, 3), torch.ones(1, 3),
                                    torch.tensor([[True, True, False]]), 0.2)
    assert float(loss) == pytest.approx(0.3625)
    assert frac == 0.5
