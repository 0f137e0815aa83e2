"""Speed as a reward (dllm_rl/rewards/speed.py): the gated speed term, LightningRL's decoupled normalisation (arXiv
2603.13319 Eq. 5-7; the numbering is unverified, see rewards/speed.py) against a hand computation, and its
TPF-aware filter (Eq. 11)."""

import math

import pytest
import torch

from dllm_rl.config import ConfigError, load_config
from dllm_rl.errors import UserError
from dllm_rl.rewards.reward_terms import CombinedReward, RewardTerm, Term, build_reward
from dllm_rl.rewards.speed import SpeedReward, speed_value
from dllm_rl.rl.advantages import compute_advantages, decoupled_advantages, group_filter
from dllm_rl.rl.algorithms import check_combination
from dllm_rl.rl.collect import RolloutCollector, rollout_columns
from dllm_rl.rl.config import RLConfig
from dllm_rl.sampling import Rollout


def _right_if_yes(prompts, completions, **columns):
    return [1.0 if c == "yes" else 0.0 for c in completions]


def _reward(speed_weight: float = 0.5, kind: str = "tpf") -> CombinedReward:
    return CombinedReward([Term("acc", 1.0, _right_if_yes, "task"),
                           Term(f"speed_{kind}", speed_weight, SpeedReward(kind), "speed")])


def _columns(tokens: list[int], nfe: list[int]) -> dict:
    return {"completion_ids": [[5] * n for n in tokens], "nfe": nfe}


def _rollout(tokens: list[int], nfe: list[int]) -> Rollout:
    n, width = len(tokens), max(tokens)
    mask = torch.tensor([[j < t for j in range(width)] for t in tokens])
    return Rollout(prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.bool),
                   completion_ids=torch.full((n, width), 5), completion_mask=mask,
                   step_map=torch.where(mask, 0, -1), nfe=torch.tensor(nfe), finish_reason=["eos"] * n)


def test_speed_kinds_and_rollout_columns():
    assert speed_value("tpf", 8, 2) == 4.0
    assert speed_value("per_pass", 8, 4) == 0.25
    assert speed_value("per_token", 8, 2) == 0.75
    assert speed_value("per_token", 4, 8) == 0.0  # more passes than tokens: nothing saved
    assert speed_value("tpf", 8, 0) == 0.0
    cols = rollout_columns(_rollout([8, 4], [2, 4]))
    assert cols["nfe"] == [2, 4] and cols["tpf"] == [4.0, 1.0]


def test_speed_counts_only_where_the_answer_is_right():
    reward = _reward(speed_weight=0.5)
    scores = reward(["p"] * 3, ["yes", "no", "yes"], **_columns([8, 8, 8], [2, 1, 8]))
    assert [float(s) for s in scores] == [1.0 + 0.5 * 4.0, 0.0, 1.0 + 0.5 * 1.0]
    assert reward.last_terms["speed_tpf"] == [4.0, 0.0, 1.0]  # the wrong answer's 8 tokens per pass count 0
    assert scores[1].info["terms"] == {"acc": 0.0, "speed_tpf": 0.0}


def test_decoupled_advantages_match_a_hand_computation():
    # one group of 4: three right answers at 2, 4 and 3 tokens per forward, one wrong one (its speed counts 0)
    reward = _reward(speed_weight=0.5)
    scores = reward(["p"] * 4, ["yes", "yes", "yes", "no"], **_columns([8, 8, 9, 8], [4, 2, 3, 1]))
    values = torch.tensor([[s.info["terms"]["acc"], s.info["terms"]["speed_tpf"]] for s in scores])
    assert values.tolist() == [[1, 2], [1, 4], [1, 3], [0, 0]]
    adv = decoupled_advantages("group_zscore", values, [1.0, 0.5], 4, "group")
    eps = 1e-4
    # Eq. 5, accuracy: mean 0.75, unbiased std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5
    acc = [(a - 0.75) / (0.5 + eps) for a in (1, 1, 1, 0)]
    # Eq. 5, speed: mean 2.25, unbiased std sqrt((0.25^2 + 1.75^2 + 0.75^2 + 2.25^2) / 3) = sqrt(8.75 / 3)
    spd = [(s - 2.25) / (math.sqrt(8.75 / 3) + eps) for s in (2, 4, 3, 0)]
    total = [a + 0.5 * s for a, s in zip(acc, spd)]  # Eq. 6 with weights 1 and 0.5
    mean = sum(total) / 4
    std = math.sqrt(sum((t - mean) ** 2 for t in total) / 3)
    expected = [(t - mean) / (std + eps) for t in total]  # Eq. 7 over the batch
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert adv.tolist() == pytest.approx([0.2925, 0.6939, 0.4932, -1.4796], abs=1e-3)
    # the plain sum of the same rewards ranks the same way here, but with the speed's raw scale in the sum
    plain = compute_advantages("group_zscore", torch.tensor([float(s) for s in scores]), 4, "group")
    assert plain.argsort().tolist() == adv.argsort().tolist()


@pytest.mark.parametrize("normalization", ["sum", "decoupled"])
@pytest.mark.parametrize("kind", ["tpf", "per_pass", "per_token"])
def test_a_fast_wrong_answer_scores_below_a_slow_right_one(normalization, kind):
    # a heavy speed weight, a very fast wrong answer (16 tokens in one pass) and a right one at a pass per token
    reward = _reward(speed_weight=10.0, kind=kind)
    completions = ["no", "yes", "yes", "no"]
    scores = reward(["p"] * 4, completions, **_columns([16, 16, 16, 16], [1, 16, 4, 8]))
    rewards = torch.tensor([float(s) for s in scores])
    if normalization == "sum":
        adv = compute_advantages("group_zscore", rewards, 4, "group")
    else:
        values = torch.tensor([[s.info["terms"]["acc"], s.info["terms"][f"speed_{kind}"]] for s in scores])
        adv = decoupled_advantages("group_zscore", values, [1.0, 10.0], 4, "group")
    fast_wrong, slow_right = float(adv[0]), float(adv[1])
    assert fast_wrong < slow_right
    assert fast_wrong == pytest.approx(float(adv[3]))  # wrong answers tie whatever their speed


def _collector(**overrides) -> RolloutCollector:
    cfg = load_config(RLConfig, None, ["rollout.num_generations=4", *[f"{k}={v}" for k, v in overrides.items()]])
    collector = RolloutCollector.__new__(RolloutCollector)
    collector.cfg, collector.rollout_hook = cfg, None
    return collector


def test_dynamic_sampling_keeps_an_all_right_group_whose_speeds_differ():
    reward = _reward(speed_weight=0.5)
    # group 1: all right, 2 / 4 / 8 / 8 tokens per forward; group 2: all right at one speed
    tokens, nfe = [8] * 8, [4, 2, 1, 1, 2, 2, 2, 2]
    rewards = torch.tensor([float(s) for s in reward(["p"] * 8, ["yes"] * 8, **_columns(tokens, nfe))])
    filt = _collector().filter(rewards, _rollout(tokens, nfe))
    assert filt.keep.tolist() == [True] * 4 + [False] * 4
    # the task reward alone gives the first group no signal: the speed term is what keeps it
    alone = torch.tensor(_right_if_yes(None, ["yes"] * 8))
    assert not _collector().filter(alone, _rollout(tokens, nfe)).keep.any()
    # LightningRL's filter (Eq. 11): a spread of at least 1 token per forward and a right answer
    narrow = _collector(tpf_spread=1.0)
    wide_wrong = torch.tensor([0.0, 0.0, 0.0, 0.1])  # all wrong, TPF 2 / 4 / 8 / 8: no right answer
    filt = narrow.filter(torch.cat([rewards[:4], wide_wrong]), _rollout(tokens, [4, 2, 1, 1] * 2))
    assert filt.keep.tolist() == [True] * 4 + [False] * 4 and filt.narrow_tpf_groups == 1
    mixed_same_speed = torch.tensor([1.0, 0.0, 1.0, 0.0])
    filt = group_filter(mixed_same_speed, 4, tpf=torch.full((4,), 2.0), tpf_spread=1.0)
    assert not filt.keep.any() and filt.narrow_tpf_groups == 1


def test_speed_settings_are_checked():
    with pytest.raises(UserError, match="a speed term counts only where the answer is right"):
        build_reward([RewardTerm(speed="tpf")])
    with pytest.raises(ConfigError, match="reward.normalization: decoupled normalises each of reward.terms"):
        load_config(RLConfig, None, ["reward.normalization=decoupled"])
    with pytest.raises(ConfigError, match=r"reward.terms.*weight: a speed term's weight is 0 or more \(got -1\)"):
        load_config(RLConfig, None, ['reward.terms=[{task: countdown}, {speed: tpf, weight: -1}]'])
    with pytest.raises(ConfigError, match="speed"):
        load_config(RLConfig, None, ['reward.terms=[{task: countdown}, {speed: fast}]'])
    cfg = load_config(RLConfig, None, ["model.path=m", "algorithm=espo", "advantage=group_zscore",
                                       "scale_rewards=group", "loss_type=sequence", "estimator=elbo",
                                       "reward.terms=[{task: countdown}, {speed: tpf}]",
                                       "reward.normalization=decoupled", "rollout_hook=mdpo"])
    with pytest.raises(ConfigError, match="the 'mdpo' rollout hook replaces samples or advantages"):
        check_combination(cfg)


def test_an_rl_step_trains_on_decoupled_speed_advantages(rl_setup, tmp_path):
    """One step of the block model with threshold decoding: the reward receives each rollout's passes, the speed
    counts only on the task's right answers, and the advantages are the decoupled ones of the step's term values."""
    from rl_helpers import rl_overrides

    from dllm_rl.rl.trainer import RLTrainer

    terms = "reward.terms=[{task: 'rl_helpers:alternating_reward'}, {speed: tpf, weight: 0.5}]"
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, terms, "reward.normalization=decoupled",
                                                   "rollout.threshold=0.3", "train.max_steps=1",
                                                   "advantage=group_zscore", "scale_rewards=group"))
    trainer = RLTrainer(cfg)
    batches, real_collect = [], trainer.collect
    trainer.collect = lambda: batches.append(real_collect()) or batches[-1]
    metrics = trainer.step().metrics
    (batch,) = batches
    tpf = batch.rollout.tokens_per_forward()
    right = torch.tensor([float(i % 2 == 0) for i in range(len(tpf))])  # alternating_reward: samples 0, 2, ...
    assert torch.equal(batch.rewards, right + 0.5 * tpf * right)
    values = torch.stack([right, tpf * right], 1)
    assert torch.allclose(batch.advantages, decoupled_advantages("group_zscore", values, [1.0, 0.5], 4, "group"),
                          atol=1e-5)
    assert metrics["tpf"] == pytest.approx(float(tpf.mean()), rel=1e-5) and metrics["reward_speed_tpf"] > 0
