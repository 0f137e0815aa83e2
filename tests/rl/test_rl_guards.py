"""What keeps a broken RL run from ending as a success: NaN weights, steps without reward signal, and rewards that
exit, overflow, fail on every sample, return NaN / inf / None or hang; and the settings that must fail in one
line before any compute (max_steps=0, estimator_options num_mc=-4, a non-finite learning rate)."""

from __future__ import annotations

import json
import logging
import math
import re
import signal
import sys
import time

import pytest
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.cli import main
from dllm_rl.config import ConfigError, load_config
from dllm_rl.models import load_model
from dllm_rl.rewards.safe import safe_scores
from dllm_rl.rl.algorithms import check_estimator_options, resolve
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.tasks.base import RewardError
from dllm_rl.training.finite import TrainingStopped


def _cfg(rl_setup, out, *extra: str) -> RLConfig:
    return load_config(RLConfig, None, rl_overrides(rl_setup, "llada", out, "algorithm=tracerl", *extra))


def _metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _nothing_published(out) -> bool:
    return not any(p.exists() for p in (out / "final", out / "summary.json")) and not list(out.glob("checkpoints/*"))


def test_nan_weights_stop_the_run_at_that_step_and_nothing_is_saved(rl_setup, tmp_path):
    cfg = _cfg(rl_setup, tmp_path / "policy", "train.max_steps=3", "run.save_every=1")
    cfg.optim.lr = math.inf  # past the config's check (which refuses it): an update that leaves the weights NaN
    with pytest.raises(TrainingStopped, match=r"^stopping at step 1: the update left NaN/inf weights in the policy "
                       r"\(optim.lr=inf\); final/ is not written\. Lower the learning rate \(optim.lr\)"):
        train(cfg, reward_fn=digit_reward)
    assert _nothing_published(tmp_path / "policy")
    # the value model's weights are checked too: value_model.lr=1e30 throws them to ~1e30 in its first update
    out = tmp_path / "value"
    with pytest.raises(TrainingStopped, match=r"^stopping at step 1: the value model's weights' norm grew from [\d.]+ "
                       r"to [\d.]+e\+3\d \(x[\d.]+e\+\d\d\) in one update at value_model.lr=1e\+30 .*Lower the "
                       r"learning rate \(value_model.lr\)"):
        train(_cfg(rl_setup, out, "train.max_steps=3", "run.save_every=1", "value_model.enabled=true",
                   "value_model.lr=1e30",
                   "drop_zero_variance=false"), reward_fn=digit_reward)
    assert _nothing_published(out)


def test_steps_without_reward_signal_stop_after_max_skipped_steps(rl_setup, tmp_path, caplog):
    """rollout.temperature=0 decodes the samples of a prompt alike: every group has equal rewards, so no step
    updates; the run used to end with exit 0 after max_steps of nothing."""
    caplog.set_level(logging.WARNING, logger="dllm_rl.rl.skipped_steps")
    with pytest.raises(TrainingStopped, match=r"^stopping at step 2: 2 steps in a row were skipped, no group had "
                       r"reward signal \(2 of 2 groups had all-equal rewards\); rollout.temperature=0 decodes every "
                       r"sample of a prompt alike: raise it, or set train.max_skipped_steps=0 to go on$"):
        train(_cfg(rl_setup, tmp_path / "a", "rollout.temperature=0", "train.max_steps=5", "train.max_skipped_steps=2"),
              reward_fn=digit_reward)
    assert [r.getMessage()[:47] for r in caplog.records if "no update" in r.getMessage()] == [
        "step 1: no update, no group had reward signal (", "step 2: no update, no group had reward signal ("]
    assert [m["skipped_step"] for m in _metrics(tmp_path / "a")] == [1.0] and _nothing_published(tmp_path / "a")
    summary = train(_cfg(rl_setup, tmp_path / "b", "rollout.temperature=0", "train.max_steps=2",
                         "train.max_skipped_steps=0"),
                    reward_fn=digit_reward)
    assert summary["steps"] == 2  # 0: never stops
    with pytest.raises(TrainingStopped, match=r"^stopping at step 1: 1 steps in a row were skipped, no group had "
                       r"reward signal \(2 of 2 groups had all-equal rewards\); check the rollouts \(rollouts.jsonl\) "
                       r"for a reward that does not vary or a policy collapsed by too large a learning rate "
                       r"\(optim.lr=0.003\), or set train.max_skipped_steps=0 to go on$"):
        train(_cfg(rl_setup, tmp_path / "c", "train.max_steps=3", "train.max_skipped_steps=1"),
              reward_fn=lambda prompts, completions, **columns: [1.0] * len(completions))


def test_nan_inf_and_none_rewards_score_zero_counted_and_warned(rl_setup, tmp_path, caplog):
    def holes(prompts, completions, **columns):
        return [(0.5, None, math.nan, -math.inf)[i % 4] for i in range(len(completions))]

    caplog.set_level(logging.WARNING, logger="dllm_rl.rl.trainer")
    train(_cfg(rl_setup, tmp_path, "train.max_steps=1", "log.rollouts=8"), reward_fn=holes)
    (m,) = _metrics(tmp_path)
    assert (m["reward_nonfinite"], m["reward_errors"], m["reward"]) == (6.0, 0.0, 0.125)  # 2 of 8 samples at 0.5
    assert [r.getMessage() for r in caplog.records if "NaN/inf/None" in r.getMessage()] == [
        "step 1: reward 'test_rl_guards:test_nan_inf_and_none_rewards_score_zero_counted_and_warned.<locals>.holes' "
        "gave NaN/inf/None for 6 of 8 samples (scored 0)"]


def test_a_reward_that_raises_on_every_sample_stops_the_run_naming_the_error(rl_setup, tmp_path):
    def broken(prompts, completions, **columns):
        return [1 / 0 for _ in completions]

    with pytest.raises(RewardError, match=r"^stopping at step 2: reward '.*broken' failed on every sample for 2 steps "
                       r"in a row \(reward.max_failure_steps=2; last error: ZeroDivisionError: division by zero\); "
                       r"fix the reward$"):
        train(_cfg(rl_setup, tmp_path, "train.max_steps=5", "reward.max_failure_steps=2"), reward_fn=broken)
    assert [(m["step"], m["reward_errors"]) for m in _metrics(tmp_path)] == [(1, 8.0)]
    assert _nothing_published(tmp_path)


def test_a_huge_reward_fails_in_one_line(rl_setup, tmp_path):
    def huge(prompts, completions, **columns):
        return [1e300] + [0.0] * (len(completions) - 1)

    with pytest.raises(RewardError, match=r"^reward '.*huge' returned 1e\+300: rewards must lie within ±1e\+15 \(the "
                       r"advantages are float32 statistics of the group\); scale the reward down$"):
        train(_cfg(rl_setup, tmp_path, "train.max_steps=1"), reward_fn=huge)


def _slow(prompts, completions, **columns):
    time.sleep(30)
    return [1.0] * len(completions)


def test_reward_timeout_scores_the_call_zero_and_counts_it_failed(rl_setup, tmp_path):
    before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    out = safe_scores(_slow, ["p"] * 3, ["a", "b", "c"], {}, name="slow", timeout_s=0.2)
    assert time.perf_counter() - start < 5
    assert (out.totals, out.failed) == ([0.0] * 3, 3)
    assert out.error == "RewardTimeout: took longer than reward.timeout_s=0.2 s"
    assert out.reasons == ["reward took longer than reward.timeout_s=0.2 s"] * 3
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    # the trainer passes reward_timeout_s on; a reward that always times out stops the run like one that raises
    with pytest.raises(RewardError, match=r"^stopping at step 1: reward '.*_slow' failed on every sample for 1 steps "
                       r"in a row \(reward.max_failure_steps=1; last error: RewardTimeout: took longer than "
                       r"reward.timeout_s=0.2 s\)"):
        train(_cfg(rl_setup, tmp_path, "train.max_steps=2", "reward.timeout_s=0.2", "reward.max_failure_steps=1"),
              reward_fn=_slow)
    with pytest.raises(ValueError, match=r"^reward.timeout_s: must be > 0, got 0.0$"):
        _cfg(rl_setup, tmp_path, "reward.timeout_s=0")


@pytest.fixture()
def rl_cli(rl_setup, tmp_path, capsys):
    """``dllm-rl rl CONFIG key=value ...`` in-process: (exit status, the error lines it printed)."""
    config = tmp_path / "rl.yaml"
    config.write_text("algorithm: tracerl\n")

    def run(*extra: str) -> tuple[int, list[str]]:
        capsys.readouterr()
        status = main(["rl", str(config), *rl_overrides(rl_setup, "llada", tmp_path / "run", *extra)])
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        lines = [line for line in err.splitlines() if line.startswith("dllm-rl rl: error: ")]
        return status, [line.replace(f"{config}: ", "CONFIG: ") for line in lines]
    return run


def test_a_reward_that_exits_fails_in_one_line_naming_it(rl_cli, tmp_path, monkeypatch):
    """sys.exit(0) in a reward used to end the run with exit status 0, no message, metrics, final/ or summary."""
    (tmp_path / "exiting_reward.py").write_text("import sys\n\n\ndef score(prompts, completions, **columns):\n"
                                                "    sys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exiting_reward", raising=False)
    assert rl_cli("train.max_steps=1", "reward.function=exiting_reward:score") == (2, [
        "dllm-rl rl: error: reward 'exiting_reward:score' raised SystemExit(0): a reward must return one score per "
        "completion and may not end the run; fix the reward"])
    assert _nothing_published(tmp_path / "run")


@pytest.mark.parametrize("lr", ["10", "1e10"])
def test_a_finite_absurd_learning_rate_is_warned_about_and_stops_the_run_at_its_first_update(rl_cli, tmp_path, caplog,
                                                                                              lr):
    """optim.lr=10 (or 1e10) passes the config's check, but AdamW moves every weight by about the learning rate:
    the run used to warn at each step that no group had reward signal and stop after 20 steps without naming the
    learning rate (1e10: after the NaN losses of train.max_bad_steps updates). The start warns about a learning
    rate outside [1e-9, 1e-2], and the weight check (training/finite.py) stops the run after its first update,
    naming the step, the learning rate and the norms it measured."""
    caplog.set_level(logging.WARNING, logger="dllm_rl.training.optim")
    status, lines = rl_cli(f"optim.lr={lr}", "train.max_steps=5", "drop_zero_variance=false",
                           "reward.function=rl_helpers:digit_reward")
    shown = f"{float(lr):g}"
    assert status == 2 and len(lines) == 1
    assert re.fullmatch(rf"dllm-rl rl: error: stopping at step 1: the policy's weights' norm grew from 1\d\.\d+ to "
                        rf"[\d.e+]+ \(x[\d.e+]+\) in one update at optim.lr={re.escape(shown)} \(the guard stops a "
                        r"change beyond x2 or x0\.5\); final/ is not written\. Lower the learning rate \(optim.lr\) "
                        r"and start again, or resume from an earlier checkpoint", lines[0]), lines[0]
    assert [r.getMessage()[:60] for r in caplog.records if r.name == "dllm_rl.training.optim"] == [
        f"optim.lr={shown} is above AdamW's plausible learning rates [1e-09, 0.01]"[:60]]
    assert _nothing_published(tmp_path / "run")


def test_a_sane_learning_rate_is_not_warned_about_and_a_tiny_one_is(rl_setup, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="dllm_rl.training.optim")
    for lr in ("0.003", "1e-10"):
        train(_cfg(rl_setup, tmp_path / lr, "train.max_steps=1", f"optim.lr={lr}"), reward_fn=digit_reward)
    assert [r.getMessage() for r in caplog.records if r.name == "dllm_rl.training.optim"] == [
        "optim.lr=1e-10 is below AdamW's plausible learning rates [1e-09, 0.01]: the weights will hardly move"]


@pytest.mark.parametrize("override,message", [
    ("train.max_steps=0", "CONFIG: train.max_steps: must be >= 1, got 0"),
    ("algorithm=espo;estimator_options={num_mc: -4}", "estimator_options: num_mc must be an integer >= 1, got -4"),
    ("estimator_options={shrinkage: 1, numm_mc: 2}", "estimator_options: estimator 'trace' got unknown option(s) "
     "numm_mc; valid options: shrinkage, layout, mask_uncounted, step_merge, block_length, max_rows, "
     "logprob_chunk_size"),
    ("optim.lr=inf", "CONFIG: optim.lr: must be a finite number, got inf"),
    ("beta=1e309", "CONFIG: beta: must be a finite number, got inf"),
])
def test_settings_that_cannot_train_fail_in_one_line_before_compute(rl_cli, tmp_path, override, message):
    assert rl_cli(*override.split(";")) == (2, [f"dllm-rl rl: error: {message}"])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_estimator_options_are_checked_at_the_training_block_not_the_models(rl_setup, tmp_path):
    """The tiny SDAR decodes in blocks of 4; with train_block_size=8 the updates score at block 8, so the block
    estimator's block_size 8 is right and 4 is wrong (it was the other way round: the check planned its dummy
    batch at the model's own block)."""
    model = load_model(rl_setup / "sdar")
    assert model.block_size == 4

    def check(*extra: str) -> None:
        cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "algorithm=espo", "estimator=block",
                                                       *extra))
        check_estimator_options(resolve(cfg, "block"), model)

    check("estimator_options={block_size: 8}", "train.block_size=8")
    check("estimator_options={block_size: 4}")  # no train.block_size: the model's block
    with pytest.raises(ConfigError, match=r"^estimator_options: block estimator: block_size=4 but the batch is laid "
                       r"out at block 8; "):
        check("estimator_options={block_size: 4}", "train.block_size=8")
    with pytest.raises(ConfigError, match=r"^train.block_size: 6 must be a multiple of the rollout block \(4\)"):
        check("train_block_size=6")
