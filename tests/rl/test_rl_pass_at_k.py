"""advantage: pass_at_k with its advantage_options in a run: the options reach the rule, and bad ones end the run
before any rollout, naming the key."""

import pytest
import torch
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rl.advantages import pass_at_k
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer


def test_a_run_takes_its_advantages_from_pass_at_k_with_its_k(rl_setup, tmp_path, monkeypatch):
    import dllm_rl.rl.advantages as advantages

    calls = []

    def spy(rewards, group_size, scale_rewards="none", k=4):
        out = pass_at_k(rewards, group_size, scale_rewards, k)
        calls.append((rewards.clone(), group_size, scale_rewards, k, out))
        return out

    monkeypatch.setitem(advantages.ADVANTAGES, "pass_at_k", spy)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "algorithm=espo", "train.max_steps=1",
                                                   "advantage=pass_at_k", "advantage_options={k: 2}",
                                                   "drop_zero_variance=false"))
    train(cfg, reward_fn=digit_reward)
    step = [c for c in calls if len(c[0]) == 8]  # the step's 2 prompts x 4 rollouts (the config check runs one group)
    assert len(step) == 1
    rewards, group, scale, k, adv = step[0]
    assert (group, scale, k) == (4, "none", 2)  # ESPO's scaling, the configured k
    assert rewards.unique().numel() > 1 and adv.abs().sum() > 0
    # one group by hand: k = 2 of 4, E[max | i in S] - E[max] over the 6 pairs
    g = rewards[:4].tolist()
    pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    mean = sum(max(g[i], g[j]) for i, j in pairs) / 6
    want = [sum(max(g[a], g[b]) for a, b in pairs if i in (a, b)) / 3 - mean for i in range(4)]
    torch.testing.assert_close(adv[:4], torch.tensor(want), atol=1e-6, rtol=0)


@pytest.mark.parametrize("options, message", [
    ("{k: 5}", r"^advantage_options: k must be in \[1, rollout.num_generations = 4\], got 5$"),
    ("{kk: 2}", r"^advantage_options: kk not read by the 'pass_at_k' advantage; valid: k$"),
])
def test_bad_advantage_options_end_the_run_before_any_rollout(rl_setup, tmp_path, monkeypatch, options, message):
    import dllm_rl.sampling.batched as batched

    monkeypatch.setattr(batched, "decode", lambda *a, **k: pytest.fail("a rollout ran"))
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "advantage=pass_at_k",
                                                   f"advantage_options={options}"))
    with pytest.raises(ConfigError, match=message):
        RLTrainer(cfg)
