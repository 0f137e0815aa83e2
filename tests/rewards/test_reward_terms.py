"""The weighted sum of reward terms: totals and per-step sums with each term's raw value, the config entry's checks,
the keys named by bad terms, and judge process rewards reaching the value model's step rewards."""

from __future__ import annotations

import pytest
import torch
from reward_helpers import tiny_llama

from dllm_rl.config import ConfigError, from_dict
from dllm_rl.errors import UserError
from dllm_rl.models import char_tokenizer
from dllm_rl.rewards.judge import Judge, JudgeConfig
from dllm_rl.rewards.reward_model import RewardModel, RewardModelConfig
from dllm_rl.rewards.reward_terms import CombinedReward, RewardTerm, Term, build_reward
from dllm_rl.rewards.safe import safe_scores
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.returns import process_step_rewards, step_ranks

TOK = char_tokenizer()


def test_the_terms_entry_is_checked_with_its_key():
    cfg = from_dict(RLConfig, {"reward": {"terms": [{"task": "gsm8k"}, {"model": "org/rm", "weight": 0.5,
                                                                        "name": "rm"}]}})
    assert [(t.kind, t.label, t.weight) for t in cfg.reward.terms] == [("task", "gsm8k", 1.0), ("model", "rm", 0.5)]
    assert cfg.reward.combined and not RLConfig().reward.combined
    with pytest.raises(ConfigError, match=r"^reward.terms\[1\]: model: give exactly one of task, model, judge, "
                                          r"speed per reward.terms entry \(this one has task, model\)"):
        from_dict(RLConfig, {"reward": {"terms": [{"task": "gsm8k"}, {"task": "gsm8k", "model": "org/rm"}]}})
    with pytest.raises(ConfigError, match=r"^reward.terms\[0\]: unknown key 'wieght'; did you mean 'weight'"):
        from_dict(RLConfig, {"reward": {"terms": [{"task": "gsm8k", "wieght": 1}]}})
    with pytest.raises(ConfigError, match=r"this one has none"):
        RewardTerm(weight=2.0)
    # a custom function is one term among others, never beside them
    with pytest.raises(ConfigError, match=r"^reward.function: is not combined with reward.judge.model; list it as a "
                                          r"term instead \(reward.terms: \[\{task: reward_helpers:constant_reward\}"):
        from_dict(RLConfig, {"reward": {"function": "reward_helpers:constant_reward", "judge": {"model": "org/j"}}})


def test_task_plus_reward_model_weighted_with_raw_values(tmp_path):
    rm_dir = tiny_llama(tmp_path / "rm")
    cfg = RewardModelConfig(device="cpu", dtype="float32", batch_size=2)
    reward = build_reward([RewardTerm(task="gsm8k"), RewardTerm(model=str(rm_dir), weight=0.5)], reward_model=cfg)
    prompts, completions = ["2+2?", "3+3?", "1+1?"], ["the answer is 4", "7", "#### 2"]
    direct = RewardModel(RewardModelConfig(model=str(rm_dir), device="cpu", dtype="float32"))(prompts, completions)
    got = reward(prompts, completions, answer=["4", "6", "2"])
    assert reward.last_terms["gsm8k"] == [1.0, 0.0, 1.0]
    assert reward.last_terms["reward_model"] == pytest.approx(direct, abs=1e-5)
    assert [float(s) for s in got] == pytest.approx([1.0 + 0.5 * direct[0], 0.5 * direct[1], 1.0 + 0.5 * direct[2]],
                                                    abs=1e-5)
    assert got[1].reason == f"gsm8k=0; reward_model={direct[1]:.4g}"
    assert reward.metrics() == pytest.approx({"reward_gsm8k": 2 / 3, "reward_reward_model": sum(direct) / 3},
                                             abs=1e-5)
    assert reward.state_dict() == {"reward_model": {"moments": {"count": 0, "mean": 0.0, "m2": 0.0}}}
    # the trainer's safe call takes it as any reward
    scored = safe_scores(reward, prompts, completions, {"answer": ["4", "6", "2"]})
    assert scored.totals == pytest.approx([float(s) for s in got]) and scored.failed == 0


def test_bad_terms_name_their_key_before_any_rollout(tmp_path):
    with pytest.raises(UserError, match=r"^reward.terms\[0\].task: unknown task 'gsm9k'; give one of .*gsm8k"):
        build_reward([RewardTerm(task="gsm9k")])
    with pytest.raises(UserError, match=r"^reward.terms\[1\].model: cannot load '.*nope'"):
        build_reward([RewardTerm(task="gsm8k"), RewardTerm(model=str(tmp_path / "nope"))],
                     reward_model=RewardModelConfig(device="cpu"))
    with pytest.raises(UserError, match=r"^reward.terms\[0\].judge: cannot load '.*nope' as a causal LM"):
        build_reward([RewardTerm(judge=str(tmp_path / "nope"))], judge=JudgeConfig(device="cpu"))
    with pytest.raises(UserError, match=r"^reward.judge.template: the template has no \{\{completion\}\}"):
        build_reward([RewardTerm(judge=str(tmp_path / "nope"))], judge=JudgeConfig(template="{{prompt}}"))
    with pytest.raises(UserError, match="^reward.terms: no reward term"):
        build_reward([])
    # reward.model / reward.judge.model alone (no terms) are named by their own keys
    with pytest.raises(UserError, match=r"^reward.model: cannot load '.*nope'"):
        build_reward([], reward_model=RewardModelConfig(model=str(tmp_path / "nope"), device="cpu"))
    with pytest.raises(UserError, match=r"^reward.judge.model: cannot load '.*nope' as a causal LM"):
        build_reward([], judge=JudgeConfig(model=str(tmp_path / "nope"), device="cpu"))


#: "abcdefgh" decoded over 4 steps, two tokens each, then an EOS filler that does not count
STEP_MAP = [0, 0, 1, 1, 3, 2, 3, 2, -1]


def _process_judge():
    # the fields pasted raw (delimit=False), so the scripted judge finds the chunk after "|"
    cfg = JudgeConfig(model="unused", mode="process", template="{{prompt}}|{{chunk}}", chunk_length=4, delimit=False)
    answers = {"abcd": "\\boxed{1}", "efgh": "\\boxed{-1}"}
    return Judge(cfg, policy_tokenizer=TOK, generator=lambda texts, n, seed: [[answers[t.split("|")[1]]] * n
                                                                              for t in texts])


def test_process_rewards_add_step_by_step_and_outcome_terms_go_on_the_last_step():
    outcome = Term("exact", 2.0, lambda prompts, completions, **cols: [1.0 if c == "abcdefgh" else 0.0
                                                                       for c in completions])
    reward = CombinedReward([outcome, Term("judge", 0.5, _process_judge())])
    got = reward(["q"], ["abcdefgh"], step_map=[STEP_MAP])[0]
    # chunk "abcd" (steps 0, 1) lands on step 1, "efgh" (steps 2, 3) on step 3; the outcome on the last step
    assert got.info["steps"] == [0.0, 0.5, 0.0, -0.5 + 2.0]
    assert float(got) == 2.0 and reward.last_terms == {"exact": [1.0], "judge": [0.0]}


def test_judge_process_rewards_reach_the_value_models_step_rewards():
    """The judge's per-step list goes through the trainer's safe call and the function that turns process rewards
    into the value model's step rewards (``ValueModel.targets`` calls it so), landing on the steps counted by
    hand."""
    scored = safe_scores(_process_judge(), ["q", "q"], ["abcdefgh", "abcdefgh"],
                         {"step_map": [STEP_MAP, STEP_MAP[:4] + [-1] * 5]})
    assert scored.steps == [[0.0, 1.0, 0.0, -1.0], [0.0, 1.0]] and scored.totals == [0.0, 1.0]
    key = torch.tensor([STEP_MAP, STEP_MAP[:4] + [-1] * 5])
    raw_rank, num = step_ranks(key, key >= 0)
    assert num.tolist() == [4, 2]
    width = int(num.max())
    got = process_step_rewards(scored.steps, raw_rank, raw_rank, width)
    assert got.tolist() == [[0.0, 1.0, 0.0, -1.0], [0.0, 1.0, 0.0, 0.0]]
    # with shrinkage 2 (steps merged in pairs) each merged step gets the sum of its decoding steps' scores
    merged = torch.where(raw_rank >= 0, raw_rank // 2, -1)
    assert process_step_rewards(scored.steps, raw_rank, merged, 2).tolist() == [[1.0, -1.0], [1.0, 0.0]]
