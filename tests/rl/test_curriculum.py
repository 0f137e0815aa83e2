"""Curricula: stages switching at a step or on the rolling reward (data filter, generation length, block size,
temperature, advantage rule), the switch printed and logged, exact resume across a boundary; online difficulty
filtering with its pass rates resumed (tiny models, a few steps)."""

import json
import logging

import pytest
import torch
from rl_helpers import digit_reward, rl_overrides

import dllm_rl.rl.collect as collect_mod
from dllm_rl.cli import main
from dllm_rl.config import ConfigError, from_dict, load_config
from dllm_rl.models import load_model
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.curriculum import Curriculum
from dllm_rl.rl.curriculum_config import CurriculumConfig, CurriculumStage
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _rollouts(out):
    return [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]


def test_stages_switch_at_their_step_or_on_the_rolling_reward():
    cur = Curriculum(CurriculumConfig(window=2, stages=[CurriculumStage(after_step=2),
                                                        CurriculumStage(reward_above=0.5)]))
    assert [cur.due(1, 0.9), cur.due(2, 0.9)] == [False, True]
    cur.enter(1, data_changed=False)
    # the rolling mean over the stage's own last 2 steps: (0.9) is not a full window, (0.9+0.0)/2, (0+1.2)/2 > 0.5
    assert [cur.due(3, 0.9), cur.due(4, 0.0), cur.due(5, 1.2)] == [False, False, True]
    assert cur.why(5) == "mean reward 0.6 of the last 2 steps > reward_above 0.5"
    cur.enter(2, data_changed=True)
    assert cur.due(6, 5.0) is False  # no stage left
    with pytest.raises(ConfigError, match=r"^curriculum.stages\[0\]: after_step: give exactly one of after_step, "
                                          r"reward_above"):
        from_dict(RLConfig, {"curriculum": {"stages": [{"gen_length": 64}]}})
    with pytest.raises(ConfigError, match=r"^curriculum.stages\[0\]: filter: write COLUMN OP VALUE"):
        from_dict(RLConfig, {"curriculum": {"stages": [{"after_step": 1, "filter": "difficulty is hard"}]}})
    with pytest.raises(ConfigError, match=r"^curriculum.pass_rate_band: give two numbers"):
        from_dict(RLConfig, {"curriculum": {"pass_rate_band": [0.9, 0.1]}})


STAGES = ("curriculum.stages=[{after_step: 1, gen_length: 16, temperature: 0.7}, "
          "{reward_above: -1.0, filter: 'target <= 4', block_size: 8, advantage: pass_at_k, "
          "advantage_options: {k: 2}}]")
COMMON = ["algorithm=tracerl", "train.max_steps=4", "run.save_every=1", "run.keep_checkpoints=4",
          "train.micro_batch_size=4", "curriculum.window=1", STAGES]


def test_stages_change_rollouts_and_data_are_logged_and_resume_exactly(rl_setup, tmp_path, monkeypatch, capsys):
    """Stage 1 after step 1 (longer, cooler rollouts); stage 2 once the last step's reward is above -1 (after step 2:
    block 8, only rows with target <= 4, Pass@2 advantages). 4 steps straight == a resume from the step-2 checkpoint,
    in stage 2."""
    seen, real = [], collect_mod.generate_batched

    def gen(model, prompts, config, *a, **k):
        seen.append((config.gen_length, config.block_size, config.temperature))
        return real(model, prompts, config, *a, **k)

    monkeypatch.setattr(collect_mod, "generate_batched", gen)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", straight, *COMMON)), reward_fn=digit_reward)
    assert seen == [(8, 4, 1.0), (16, 4, 0.7), (16, 8, 0.7), (16, 8, 0.7)]
    out = capsys.readouterr().out
    assert "curriculum: stage 1 from step 2 (after_step 1): rollout.gen_length 8 -> 16; rollout.temperature 1.0 -> " \
           "0.7" in out
    assert ("curriculum: stage 2 from step 3 (mean reward " in out and "of the last 1 steps > reward_above -1): "
            "rollout.block_size None -> 8; advantage group_zscore -> pass_at_k; advantage_options None -> {'k': 2}; "
            "data: 15 prompts of " in out and "train.jsonl where target <= 4" in out)
    assert [m["curriculum_stage"] for m in _metrics(straight) if "reward" in m] == [1.0, 2.0, 2.0, 2.0]
    steps = _rollouts(straight)
    targets = {int(r["prompt"].split("target")[-1]) for r in steps if r["step"] > 2}  # "nums 1 2 1 target 1"
    assert targets and max(targets) <= 4
    saved = json.loads((straight / "checkpoints" / "step-0000002" / "trainer_state.json").read_text())
    assert saved["extra"]["curriculum"]["stage"] == 2
    seen.clear()
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", resumed, *COMMON,
                                                   f"run.resume={straight / 'checkpoints' / 'step-0000002'}")),
          reward_fn=digit_reward)
    assert seen == [(16, 8, 0.7), (16, 8, 0.7)]
    assert [r for r in steps if r["step"] > 2] == _rollouts(resumed)
    keys = ("step", "reward", "completion_length", "nfe", "lr", "kept_samples", "curriculum_stage")
    assert ([{k: m[k] for k in keys} for m in _metrics(straight) if m["step"] > 2 and "reward" in m]
            == [{k: m[k] for k in keys} for m in _metrics(resumed) if "reward" in m])
    a, b = (load_model(out / "final").hf_model.state_dict() for out in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stages_change_the_advantage_rule_and_its_options(rl_setup, tmp_path, monkeypatch, capsys):
    """Pass@k with k = 2 after step 1, k = 3 after step 2 (options alone keep the rule), leave-one-out after step 3
    (a rule named alone starts from its own options): each step's advantages are that rule's on its rewards."""
    calls, real = [], collect_mod.compute_advantages

    def spy(name, rewards, group, scale, options):
        out = real(name, rewards, group, scale, options)
        calls.append((name, options, rewards.clone(), scale, out))
        return out

    monkeypatch.setattr(collect_mod, "compute_advantages", spy)
    stages = ("curriculum.stages=[{after_step: 1, advantage: pass_at_k, advantage_options: {k: 2}}, "
              "{after_step: 2, advantage_options: {k: 3}}, {after_step: 3, advantage: leave_one_out}]")
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "train.max_steps=4",
                                                   "drop_zero_variance=false", stages)), reward_fn=digit_reward)
    assert [(name, options) for name, options, *_ in calls] == [
        ("leave_one_out", None), ("pass_at_k", {"k": 2}), ("pass_at_k", {"k": 3}), ("leave_one_out", None)]
    # graded rewards (digit_reward) differ within the groups, so the rules' advantages differ on the same rewards
    _, _, rewards, scale, adv = calls[1]
    assert not torch.allclose(adv, real("leave_one_out", rewards, 4, scale, None))
    out = capsys.readouterr().out
    assert ("curriculum: stage 1 from step 2 (after_step 1): advantage leave_one_out -> pass_at_k; advantage_options "
            "None -> {'k': 2}") in out
    assert "curriculum: stage 2 from step 3 (after_step 2): advantage_options {'k': 2} -> {'k': 3}" in out
    assert ("curriculum: stage 3 from step 4 (after_step 3): advantage pass_at_k -> leave_one_out; advantage_options "
            "{'k': 3} -> None") in out


def _parity_reward(prompts, completions, target=None, **cols):
    """1 (plus a little) for every sample of an even target, a little for an odd one: pass rates 1 and 0."""
    return [float(t % 2 == 0) + 0.1 * d for t, d in zip(target, digit_reward(prompts, completions))]


def test_online_difficulty_filtering_skips_prompts_outside_the_band_and_resumes(rl_setup, tmp_path, monkeypatch):
    """Four prompts (targets 7, 6, 4, 3), two per step: after the first epoch (2 steps) the even targets, which
    always pass (pass rate 1, above the band [0, 0.5]), are skipped; the pass rates travel in checkpoints."""
    common = ["algorithm=tracerl", "data.train_limit=4", "train.max_steps=4", "run.save_every=1",
              "run.keep_checkpoints=4",
              "curriculum.pass_rate_band=[0.0, 0.5]", "drop_zero_variance=false"]
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / "t", *common)),
                        reward_fn=_parity_reward)
    drawn, real_draw = [], trainer.collector.draw
    trainer.collector.draw = lambda k: drawn.append(real_draw(k)) or drawn[-1]
    skipped = []
    for _ in range(4):
        skipped.append(trainer.step().metrics["skipped_prompts"])
        trainer.step_idx += 1
    targets = [[trainer.train_task[i]["target"] for i in idx] for idx in drawn]
    assert sorted(targets[0] + targets[1]) == [3, 4, 6, 7]  # the first epoch: every prompt, none known yet
    assert [sorted(t) for t in targets[2:]] == [[3, 7], [3, 7]]
    assert skipped == [0.0, 0.0, 2.0, 1.0]  # the even targets met before the odd ones in the seeded permutations
    assert trainer.curriculum.pass_rates == {i: float(trainer.train_task[i]["target"] % 2 == 0) for i in range(4)}
    trainer.close()
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", straight, *common)), reward_fn=_parity_reward)
    ckpt = straight / "checkpoints" / "step-0000002"
    rates = json.loads((ckpt / "trainer_state.json").read_text())["extra"]["curriculum"]["pass_rates"]
    assert sorted(rates.values()) == [0.0, 0.0, 1.0, 1.0]
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", resumed, *common, f"run.resume={ckpt}")),
          reward_fn=_parity_reward)
    assert [r for r in _rollouts(straight) if r["step"] > 2] == _rollouts(resumed)
    assert [m["skipped_prompts"] for m in _metrics(resumed) if "loss" in m] == [2.0, 1.0]
    assert torch.equal(torch.tensor([m["loss"] for m in _metrics(straight) if "loss" in m][2:]),
                       torch.tensor([m["loss"] for m in _metrics(resumed) if "loss" in m]))


def test_a_bad_stage_is_refused_before_any_rollout(rl_setup, tmp_path):
    for stage, message in (
        ("{after_step: 1, gen_length: 6}", r"^curriculum.stages\[0\]: rollout.gen_length: 6 is not a multiple of the "
                                           r"model's block_size \(4\)"),
        ("{after_step: 1, filter: 'target > 99'}", r"^curriculum.stages\[0\].filter: no row of .*train.jsonl passes "
                                                   r"target > 99"),
        ("{after_step: 1, filter: 'level > 2'}", r"^curriculum.stages\[0\].filter: .*train.jsonl, line 1 has no column "
                                                 r"'level'"),
        ("{after_step: 1, advantage_options: {k: 2}}", r"^curriculum.stages\[0\]: advantage_options: k not read by the "
                                                       r"'leave_one_out' advantage"),
        ("{after_step: 1, advantage: pass_at_k, advantage_options: {k: 9}}",
         r"^curriculum.stages\[0\]: advantage_options: k must be in \[1, rollout.num_generations = 4\], got 9"),
    ):
        with pytest.raises(ConfigError, match=message):
            RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "run.overwrite=true",
                                                               f"curriculum.stages=[{stage}]")))


def test_a_stage_is_checked_against_the_model_and_its_data_like_the_config_as_given(rl_setup, tmp_path):
    """The checks the config as given gets against the loaded model and data (here: the longest prompt with its
    completion slots within the context, 1024 positions) run on every stage's config, with its own data, before
    the first rollout; a stage used to train until it began and fail then, without naming itself."""
    def trainer(*extra):
        return RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "run.overwrite=true",
                                                                  *extra)))

    too_long = (r"the longest training prompt \(item \d+ of .*train.jsonl( where target <= 4)?\) has \d+ tokens; "
                r"with gen_length 1024 it needs \d+ positions but the model's context is 1024 "
                r"\(max_position_embeddings\); shorten the prompt or gen_length$")
    with pytest.raises(ConfigError, match=r"^rollout.gen_length: " + too_long):
        trainer("rollout.gen_length=1024")
    with pytest.raises(ConfigError, match=r"^curriculum.stages\[1\]: rollout.gen_length: " + too_long):
        trainer("curriculum.stages=[{after_step: 1, gen_length: 16}, {after_step: 2, filter: 'target <= 4', "
                "gen_length: 1024}]")
    # the held-out prompts, with the evaluation's settings: 1012 tokens fit beside 4 slots but not beside 16
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"nums": [1] * 499, "target": 1}) + "\n")
    with pytest.raises(ConfigError, match=r"^curriculum.stages\[0\]: rollout.gen_length: the longest held-out prompt "
                                          r"\(item 0 of .*long.jsonl\) has 1012 tokens; with gen_length 16 it needs "
                                          r"1028 positions"):
        trainer("eval.limit=1", f"eval.data={long}", "curriculum.stages=[{after_step: 1, gen_length: 16}]",
                "rollout.gen_length=4", "rollout.block_length=4")


def test_stage_order_reward_thresholds_and_filter_values_are_checked(rl_setup, tmp_path, caplog, capsys):
    """Stages out of order and a filter whose value is not one are refused when the config is read (the filter
    'target >=' used to end in a YAML ConstructorError traceback); a reward_above the task's rewards (in [0, 1])
    can never pass is refused, one they always pass and a stage after train.max_steps are warned about."""
    for stages, message in (
        ([{"after_step": 5}, {"after_step": 3}], r"^curriculum.stages\[1\].after_step: 3 is not after "
                                                 r"curriculum.stages\[0\].after_step \(5\); stages begin in the order "
                                                 r"given"),
        ([{"after_step": 5}, {"reward_above": 0.5}, {"after_step": 5}], r"^curriculum.stages\[2\].after_step: 5 is "
                                                                         r"not after curriculum.stages\[0\]"),
        ([{"after_step": 1, "filter": "target >="}], r"^curriculum.stages\[0\]: filter: got 'target >=', whose value "
                                                     r"'=' \(after '>'\) is not a number, a word or a quoted string"),
    ):
        with pytest.raises(ConfigError, match=message):
            from_dict(RLConfig, {"curriculum": {"stages": stages}})
    config = tmp_path / "rl.yaml"
    config.write_text("algorithm: tracerl\n")
    args = ["rl", str(config), *rl_overrides(rl_setup, "sdar", tmp_path / "run")]
    assert main([*args, "curriculum.stages=[{after_step: 1, filter: 'target >='}]"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [
        f"dllm-rl rl: error: {config}: curriculum.stages[0]: filter: got 'target >=', whose value '=' (after '>') is "
        "not a number, a word or a quoted string; write COLUMN OP VALUE, e.g. 'difficulty >= 3'"]

    def trainer(*extra):
        return RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "run.overwrite=true",
                                                                  "train.max_steps=3", *extra)))

    with pytest.raises(ConfigError, match=r"^curriculum.stages\[1\].reward_above: 1 is never passed: the countdown "
                                          r"task's rewards lie in \[0, 1\] and the stage begins once their mean"):
        trainer("curriculum.stages=[{after_step: 1}, {reward_above: 1.0}]")
    caplog.set_level(logging.WARNING, logger="dllm_rl.rl.curriculum")
    trainer("curriculum.stages=[{reward_above: -0.5}, {after_step: 3}]").close()
    assert [r.getMessage() for r in caplog.records if r.name == "dllm_rl.rl.curriculum"] == [
        "curriculum.stages[0].reward_above: -0.5 is below the countdown task's rewards [0, 1]: the stage begins as "
        "soon as curriculum.window steps are done",
        "curriculum.stages[1] never begins: its after_step 3 is not before train.max_steps=3"]
    caplog.clear()
    # a reward of the run's own has no known range: nothing to compare with
    RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "run.overwrite=true",
                                                       "curriculum.stages=[{reward_above: 5.0}]")),
              reward_fn=digit_reward).close()
    assert not [r for r in caplog.records if r.name == "dllm_rl.rl.curriculum"]
