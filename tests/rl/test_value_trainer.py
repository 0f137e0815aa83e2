"""TraceRL with the value model, process rewards and block-size adaptation through the RL trainer (tiny models,
1-2 steps)."""

import dataclasses
import json
import math

import pytest
import torch
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rewards.safe import safe_scores
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer

VALUE = ["algorithm=tracerl", "value_model.enabled=true", "value_model.lr=0.01", "drop_zero_variance=false"]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _value_state(path):
    return torch.load(path / "value_model.pt", weights_only=True)["model"]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_tracerl_with_the_value_model_trains_both(rl_setup, tmp_path, family):
    train(load_config(RLConfig, None, rl_overrides(rl_setup, family, tmp_path, *VALUE, "train.max_steps=2")),
          reward_fn=digit_reward)
    rows = [m for m in _metrics(tmp_path) if "loss" in m]
    assert len(rows) == 2
    assert rows[0]["value_mean"] == 0.0  # the zero head: the first step's values are exactly 0
    assert rows[1]["value_mean"] != 0.0 and all(math.isfinite(m["value_loss"]) for m in rows)
    assert rows[0]["token_adv_mean"] == pytest.approx(rows[0]["return_mean"])  # A = R - 0 at gamma = lam = 1
    state = _value_state(tmp_path / "checkpoints" / "step-0000002")
    assert torch.count_nonzero(state["head.weight"]) > 0


def test_the_policy_uses_the_values_from_before_the_value_update(rl_setup, tmp_path, monkeypatch):
    """The advantages handed to the policy loss are R - V with V the values read before this step's value
    update: at step 1 exactly the returns (the head is 0), though the value model has moved by the loss."""
    import dllm_rl.rl.update as trainer_mod

    seen = []
    real = trainer_mod.POLICY_LOSSES["token"]

    def spy(new, old, ref, adv, lengths, cfg):
        seen.append(adv.detach().clone())
        return real(new, old, ref, adv, lengths, cfg)

    # the registered token loss (its kl_level, ...) that records its advantages
    monkeypatch.setitem(trainer_mod.POLICY_LOSSES, "token", dataclasses.replace(real, fn=spy))
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, *VALUE,
                                                                 "train.max_steps=1")),
                        reward_fn=lambda p, c, **k: [float(i % 2) for i in range(len(c))])
    m = trainer.step().metrics
    (adv,) = seen
    assert adv.dim() == 2 and adv.shape[0] == 8  # one advantage per completion token
    assert set(torch.unique(adv).tolist()) <= {0.0, 1.0}  # R - 0: the rewards 0/1 on every counted token
    assert m["value_loss"] > 0 and m["value_mean"] == 0.0
    assert torch.count_nonzero(trainer.value.model.head.weight) > 0  # updated after the policy's pass


def test_value_model_resumes_exactly(rl_setup, tmp_path):
    common = [*VALUE, "train.num_iterations=2", "train.micro_batch_size=4", "train.max_steps=3", "run.save_every=1",
              "run.keep_checkpoints=4"]
    straight = tmp_path / "straight"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", straight, *common)), reward_fn=digit_reward)
    ckpt = straight / "checkpoints" / "step-0000001"
    resumed = tmp_path / "resumed"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", resumed, *common, f"run.resume={ckpt}")),
          reward_fn=digit_reward)
    a, b = (_value_state(d / "checkpoints" / "step-0000003") for d in (straight, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    keys = ("loss", "value_loss", "value_mean")
    la = [[m[k] for k in keys] for m in _metrics(straight) if "loss" in m][1:]
    lb = [[m[k] for k in keys] for m in _metrics(resumed) if "loss" in m]
    assert la == lb and len(lb) == 2
    bare = tmp_path / "bare"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", bare, "algorithm=tracerl", "train.max_steps=1")),
          reward_fn=digit_reward)
    # turning the value model on at a resume makes another run: refused before the missing value model is read
    with pytest.raises(ConfigError, match="value_model.enabled False -> True"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / "x", *VALUE,
                                                           f"run.resume={bare / 'checkpoints' / 'step-0000001'}")))


def test_lora_policy_value_model_is_the_base_with_its_own_adapter(rl_setup, tmp_path):
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", tmp_path, *VALUE, "lora.enabled=true", "lora.r=2", "train.max_steps=1")),
        reward_fn=digit_reward)
    value_trainable = {n for n, p in trainer.value.model.named_parameters() if p.requires_grad}
    assert "head.weight" in value_trainable
    assert value_trainable - {"head.weight"} and all("lora_" in n for n in value_trainable - {"head.weight"})
    before = {n: p.detach().clone() for n, p in trainer.value.model.named_parameters() if p.requires_grad}
    m = trainer.step().metrics
    assert math.isfinite(m["value_loss"])
    moved = [n for n, p in trainer.value.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert "head.weight" in moved


def test_value_model_needs_the_token_loss(rl_setup, tmp_path):
    with pytest.raises(ConfigError, match="value_model.enabled: the value model gives per-token advantages, which "
                                          "need loss_type=token \\(got 'sequence'\\)"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "algorithm=espo",
                                                           "value_model.enabled=true")))


def test_process_rewards_are_summed_for_the_plain_trainer_and_stepped_for_the_value_model(rl_setup, tmp_path):
    def per_step(prompts, completions, **cols):
        return [[0.5, 0.25] if i % 2 else 1.0 for i in range(len(completions))]

    scored = safe_scores(per_step, ["p"] * 2, ["a", "b"], {})
    assert scored.totals == [1.0, 0.75] and scored.steps == [None, [0.5, 0.25]]
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, *VALUE,
                                                                 "train.max_steps=1")), reward_fn=per_step)
    seen, real = [], trainer.value.targets
    trainer.value.targets = lambda batch, rewards, scores: seen.append((rewards.tolist(), scores)) or real(
        batch, rewards, scores)
    m = trainer.step().metrics
    assert m["reward"] == pytest.approx(0.875)  # the plain trainer's reward: the per-step scores summed
    ((rewards, scores),) = seen
    assert rewards == [1.0, 0.75] * 4 and scores == [None, [0.5, 0.25]] * 4  # the value model gets the steps


def test_block_size_adaptation_rolls_out_at_4_and_trains_at_8(rl_setup, tmp_path, monkeypatch):
    import dllm_rl.rl.collect as collect_mod
    import dllm_rl.rl.trainer as trainer_mod
    import dllm_rl.rl.update as update_mod

    blocks = {"rollout": set(), "train": set(), "eval": set()}
    real_gen, real_est = collect_mod.generate_batched, update_mod.estimate
    real_heldout = trainer_mod.heldout_accuracy

    own = set()  # the model's own block: never changed to run at another (the block travels as data)

    def gen(model, prompts, config, *a, **k):
        own.add(model.block_size)
        out = real_gen(model, prompts, config, *a, **k)
        blocks["rollout"].add((config.block_size, out.block_size))
        return out

    def est(model, name, batch, *a, **k):
        own.add(model.block_size)
        blocks["train"].add(batch.block_size)
        return real_est(model, name, batch, *a, **k)

    def heldout(model, tokenizer, task, examples, config, *a, **k):
        own.add(model.block_size)
        blocks["eval"].add(config.block_size)
        return real_heldout(model, tokenizer, task, examples, config, *a, **k)

    monkeypatch.setattr(collect_mod, "generate_batched", gen)
    monkeypatch.setattr(update_mod, "estimate", est)
    monkeypatch.setattr(trainer_mod, "heldout_accuracy", heldout)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "algorithm=tracerl", "train.max_steps=1",
                                                   "train.block_size=8", "eval.block_size=8", "eval.limit=2",
                                                   "drop_zero_variance=false"))
    summary = train(cfg, reward_fn=digit_reward)
    assert blocks == {"rollout": {(4, 4)}, "train": {8}, "eval": {8}} and own == {4}
    assert math.isfinite([m for m in _metrics(tmp_path) if "loss" in m][0]["loss"])
    assert json.loads((tmp_path / "final" / "config.json").read_text())["block_size"] == 4 and summary["steps"] == 1
    for bad, msg in (("train.block_size=6", "train.block_size: 6 must be a multiple of the rollout block \\(4\\)"),
                     ("rollout.block_size=8", "train.block_size: 8 must be a multiple|at least as large")):
        extra = [bad] if bad.startswith("train") else [bad, "train.block_size=4"]
        with pytest.raises(ConfigError, match=msg):
            RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path / "bad", *extra)))
    with pytest.raises(ConfigError, match="rollout.block_size / train.block_size: for block models"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / "bad", "train.block_size=8")))


def test_help_config_documents_the_value_model_and_block_sizes(capsys):
    from dllm_rl.cli import main

    with pytest.raises(SystemExit) as stop:  # --help-config prints the keys and exits, as --help does
        main(["rl", "--help-config"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    for key in ("value_model.enabled (default False)", "value_model.init_from (default 'policy')",
                "value_model.lr (default None)", "value_model.epsilon (default 0.2)", "value_model.gamma (default 1.0)",
                "value_model.lam (default 1.0)", "value_model.whiten (default False)",
                "rollout.block_size (default None)", "train.block_size (default None)",
                "eval.block_size (default None)"):
        assert key in out


def test_the_tracerl_preset_keeps_the_value_model_off(rl_setup, tmp_path):
    trainer = RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "algorithm=tracerl")))
    assert trainer.cfg.value_model.enabled is False and trainer.value is None
