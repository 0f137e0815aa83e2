"""The RL trainer end to end on tiny models: every preset, resume, faults, common random numbers."""

import json
import logging
import math
from dataclasses import replace

import pytest
import torch
from rl_helpers import digit_reward, needs_cxx, rl_overrides

from dllm_rl.config import ConfigError, load_config
from dllm_rl.models import load_model
from dllm_rl.rewards.safe import safe_rewards
from dllm_rl.rl import losses as losses_mod
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.seeding import derive_seed
from dllm_rl.training.finite import TrainingStopped


def _weights(path):
    return {k: v.clone() for k, v in load_model(path).hf_model.state_dict().items()}


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "family,algorithm",
    [("llada", "espo"), ("llada", "tracerl"), ("llada", "diffu_grpo"), ("llada", "coupled_grpo"),
     ("llada", "random_mask_grpo"), ("sdar", "tracerl"), ("sdar", "espo")],
)
def test_each_preset_runs_with_finite_loss_and_moves_the_weights(rl_setup, tmp_path, family, algorithm):
    drawn = (family, algorithm) == ("llada", "espo")  # the dashboard once (log.dashboard; about a CPU-second)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, family, tmp_path, f"algorithm={algorithm}",
                                                   "train.max_steps=2", "drop_zero_variance=false",
                                                   f"log.dashboard={drawn}"))
    summary = train(cfg, reward_fn=digit_reward)
    rows = [m for m in _metrics(tmp_path) if "loss" in m]
    assert len(rows) == 2 and all(math.isfinite(m["loss"]) for m in rows)
    assert all(m["kept_samples"] == 8 for m in rows)
    assert all(math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in rows)  # logged before clipping
    before, after = _weights(rl_setup / family), _weights(summary["final_model"])
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2, f"{algorithm}: only {len(changed)} tensors changed"
    if drawn:
        assert summary["plots"] == [str(tmp_path / "dashboard.png")]
        assert (tmp_path / "dashboard.png").stat().st_size > 1000
    else:
        assert summary["plots"] == [] and not (tmp_path / "dashboard.png").exists()
    assert not (tmp_path / "plots").exists()  # per-metric PNGs are opt-in (dllm-rl plot --per-metric)


@pytest.mark.parametrize("family,estimator", [("sdar", "block"), ("llada", "ar")])
def test_rl_trains_with_the_estimators_sft_registered(rl_setup, tmp_path, family, estimator):
    """block and ar are registered planners like the RL ones, so an RL preset runs on them by name."""
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, family, tmp_path, "algorithm=tracerl",
                                                   f"estimator={estimator}", "train.max_steps=1",
                                                   "train.num_iterations=2",
                                                   "drop_zero_variance=false"))
    summary = train(cfg, reward_fn=digit_reward)
    (row,) = [m for m in _metrics(tmp_path) if "loss" in m]
    assert math.isfinite(row["loss"]) and row["kept_samples"] == 8
    assert row["ratio_dev_first_update"] == 0.0  # old and new policy scored the same rows
    before, after = _weights(rl_setup / family), _weights(summary["final_model"])
    assert sum(not torch.equal(before[k], after[k]) for k in before) >= len(before) // 2


def test_first_update_ratio_is_exactly_one_with_common_random_numbers(rl_setup, tmp_path):
    for algo in ("espo", "diffu_grpo"):
        out = tmp_path / algo
        cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", out, f"algorithm={algo}", "train.max_steps=1",
                                                       "train.num_iterations=2", "train.micro_batch_size=4"))
        train(cfg, reward_fn=digit_reward)
        (row,) = [m for m in _metrics(out) if "loss" in m]
        assert row["ratio_dev_first_update"] == 0.0  # old and new policy saw the same masks
        assert row["clip_frac"] <= 0.5


@pytest.mark.parametrize("noise", ["sample", "group"])
def test_estimator_noise_per_sample_or_shared_by_a_prompt_group(rl_setup, tmp_path, monkeypatch, noise):
    """estimator_noise=group: the 4 samples of a prompt draw the same masks (same n, same positions where their
    counted lengths agree); sample: every sample its own."""
    import dllm_rl.rl.update as trainer_mod

    seen, real = [], trainer_mod.estimate

    def spy(model, name, batch, gen, **opts):
        out = real(model, name, batch, gen, **opts)
        seen.append((batch.sample_seeds.tolist(), batch.completion_mask.sum(-1).tolist(), out.weight[0].clone()))
        return out

    monkeypatch.setattr(trainer_mod, "estimate", spy)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=espo", "train.max_steps=1",
                                                   "drop_zero_variance=false", f"estimator_noise={noise}",
                                                   "estimator_options={num_mc: 1, coupled: false}"))
    RLTrainer(cfg, reward_fn=digit_reward).step()
    seeds, lengths, weight = seen[0]
    assert len(seeds) == 8
    groups = [seeds[0:4], seeds[4:8]]
    pairs = [(i, j) for g in (0, 4) for i in range(g, g + 4) for j in range(i + 1, g + 4) if lengths[i] == lengths[j]]
    assert pairs  # samples of one prompt with equal counted lengths
    same = [torch.equal(weight[i], weight[j]) for i, j in pairs]
    if noise == "group":
        assert all(len(set(g)) == 1 for g in groups) and groups[0][0] != groups[1][0]
        assert all(same)
    else:
        assert len(set(seeds)) == 8 and not all(same)
    with pytest.raises(ConfigError, match="estimator_noise: 'prompt' is not allowed; choose one of sample, group"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "estimator_noise=prompt")))


@pytest.mark.parametrize("ema_start", [0, 2])
def test_resume_gives_identical_weights_and_rollouts(rl_setup, tmp_path, ema_start):
    """4 steps straight == 2 steps, a kill, then a resume from the step-2 checkpoint for the last 2; with
    ema_start=2 the checkpoint's weight average holds no update yet."""
    common = ["algorithm=tracerl", "train.num_iterations=2", "train.micro_batch_size=4", "train.max_steps=4",
              "run.save_every=2",
              "run.keep_checkpoints=3", "train.ema_decay=0.5", f"train.ema_start={ema_start}"]
    straight = tmp_path / "straight"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", straight, *common)), reward_fn=digit_reward)
    ckpt = straight / "checkpoints" / "step-0000002"
    assert ckpt.is_dir()
    resumed = tmp_path / "resumed"
    train(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", resumed, *common, f"run.resume={ckpt}")),
          reward_fn=digit_reward)
    for saved in ("final", "checkpoints/step-0000004/model"):  # the weight average, the live policy
        a, b = _weights(straight / saved), _weights(resumed / saved)
        assert all(torch.equal(a[k], b[k]) for k in a)
    ra = [json.loads(x) for x in (straight / "rollouts.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (resumed / "rollouts.jsonl").read_text().splitlines()]
    assert len(ra) == 16 and [r for r in ra if r["step"] > 2] == rb
    la = [m["loss"] for m in _metrics(straight) if "loss" in m][2:]
    lb = [m["loss"] for m in _metrics(resumed) if "loss" in m]
    assert la == lb


def test_weight_average_is_what_gets_evaluated_and_saved(rl_setup, tmp_path):
    """ema_decay: final/ holds the mean of the live weights after steps 1 and 2 (still in the warm-up, where the
    average is a plain mean), the live policy keeps its own weights, and both accuracies are reported."""
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl",
                                                   "train.max_steps=2",
                                                   "drop_zero_variance=false", "train.ema_decay=0.9", "eval.limit=4"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    live = []
    for _ in range(2):
        trainer.step()
        live.append({k: v.detach().clone() for k, v in trainer.model.hf_model.state_dict().items()})
    assert any(not torch.equal(live[0][k], live[1][k]) for k in live[0])
    final = _weights(trainer.save_final_model())
    for k in final:
        assert torch.allclose(final[k], (live[0][k] + live[1][k]) / 2, atol=1e-6), k
    assert all(torch.equal(trainer.model.hf_model.state_dict()[k], live[1][k]) for k in live[1])
    with trainer.averaged():
        averaged_eval = trainer.evaluate(live=True)  # the average is in place: the "live" weights are it
    assert trainer.evaluate().texts == averaged_eval.texts

    summary = train(load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", tmp_path / "run", "algorithm=tracerl", "train.max_steps=2", "train.ema_decay=0.9",
        "eval.limit=2")),
        reward_fn=digit_reward)
    assert 0.0 <= summary["accuracy_after_live"] <= 1.0
    assert [m for m in _metrics(tmp_path / "run") if "eval_accuracy_live" in m][0]["step"] == 2
    with pytest.raises(ConfigError, match=r"ema_decay: must be in \[0, 1\), got 1.0"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "train.ema_decay=1.0")))


def test_weight_average_takes_every_nth_step_after_ema_start(rl_setup, tmp_path, caplog):
    """ema_start=1, ema_every=2: until step 3 the returned weights are the live ones (an average of no updates);
    final/ then holds the plain mean of the live weights after steps 3 and 5, and no other step's."""
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl",
                                                   "train.max_steps=5", "drop_zero_variance=false",
                                                   "train.ema_decay=0.9", "train.ema_start=1", "train.ema_every=2"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    live, updates = [], []
    for _ in range(5):
        trainer.step()
        trainer.step_idx += 1  # as the run's loop does after each step
        live.append({k: v.detach().clone() for k, v in trainer.model.hf_model.state_dict().items()})
        updates.append(trainer.ema.updates)
        if len(live) == 2:
            early = _weights(trainer.save_final_model())
            assert all(torch.equal(early[k], live[1][k]) for k in early)
    assert updates == [0, 0, 1, 1, 2]
    final = _weights(trainer.save_final_model())
    moved = [k for k in final if not torch.equal(live[2][k], live[4][k])]
    assert moved
    for k in final:
        assert torch.allclose(final[k], (live[2][k] + live[4][k]) / 2, atol=1e-6), k
    assert not all(torch.allclose(final[k], (live[2][k] + live[3][k] + live[4][k]) / 3, atol=1e-6) for k in moved)
    for key in ("train.ema_start=60", "train.ema_every=20"):  # without a weight average they would do nothing
        with pytest.raises(ConfigError, match=rf"{key.split('=')[0]}: shapes the weight average, which is off"):
            load_config(RLConfig, None, [key])
    with caplog.at_level(logging.WARNING, logger="dllm_rl.rl.trainer"):  # an average that never starts is said
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / "late", "algorithm=tracerl",
                                                           "train.max_steps=3", "train.ema_decay=0.9",
                                                           "train.ema_start=3")), reward_fn=digit_reward)
    assert "first update is at step 4, after train.max_steps=3" in caplog.text


def test_reward_that_raises_for_one_sample_scores_it_zero():
    def flaky(prompts, completions, **cols):
        if any(c == "boom" for c in completions):
            raise RuntimeError("cannot parse")
        return [1.0 for _ in completions]

    rewards, reasons = safe_rewards(flaky, ["p"] * 3, ["ok", "boom", "fine"], {"target": [1, 2, 3]})
    assert rewards == [1.0, 0.0, 1.0]
    assert "RuntimeError: cannot parse" in reasons[1]
    rewards, _ = safe_rewards(lambda p, c, **k: [float("nan"), 2.0], ["p", "q"], ["a", "b"], {})
    assert rewards == [0.0, 2.0]


def test_a_loss_with_a_ratio_must_report_it(rl_setup, tmp_path, monkeypatch):
    """The first-update ratio check reads the loss's declared ``ratio_free``: a loss with a ratio whose statistics
    lack ``ratio_max_dev`` is an error (it used to count as a deviation of 0), and a ratio-free one reports none."""
    def silent(new, old, ref, adv, lengths, config):
        out = losses_mod.token_clipped_loss(new, old, ref, adv, lengths, config)
        return losses_mod.LossOutput(out.loss, {k: v for k, v in out.stats.items() if k != "ratio_max_dev"})

    token = losses_mod.POLICY_LOSSES["token"]
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl", "beta=0",
                                                   "train.max_steps=2"))
    monkeypatch.setitem(losses_mod.POLICY_LOSSES, "token", replace(token, fn=silent))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    try:
        with pytest.raises(ValueError, match=r"^policy loss 'token' has an importance ratio but reported no "
                                             r"ratio_max_dev statistic \(register a loss without a ratio with "
                                             r"ratio_free=True\)$"):
            trainer.step()
        monkeypatch.setitem(losses_mod.POLICY_LOSSES, "token", replace(token, fn=silent, ratio_free=True))
        trainer.step_idx += 1
        metrics = trainer.step().metrics
        assert "loss" in metrics and "ratio_dev_first_update" not in metrics
    finally:
        trainer.close()


def test_nan_loss_skips_updates_and_stops(rl_setup, tmp_path, monkeypatch):
    def nan_loss(new, old, ref, adv, lengths, config):
        out = losses_mod.token_clipped_loss(new, old, ref, adv, lengths, config)
        return losses_mod.LossOutput(out.loss * float("nan"), out.stats)

    # the registered token loss (its kl_level, ...) with a NaN value
    monkeypatch.setitem(losses_mod.POLICY_LOSSES, "token",
                        replace(losses_mod.POLICY_LOSSES["token"], fn=nan_loss))
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl",
                                                   "train.max_steps=5", "train.max_bad_steps=2"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    start = {k: v.clone() for k, v in trainer.model.hf_model.state_dict().items()}
    trainer.step()  # first bad update: skipped, weights untouched
    assert trainer.bad_updates == 1
    assert all(torch.equal(v, trainer.model.hf_model.state_dict()[k]) for k, v in start.items())
    trainer.step_idx += 1
    with pytest.raises(TrainingStopped,
                       match=r"^stopping at step 2: 2 updates had a NaN/inf loss \(train.max_bad_steps=2\); "
                       r"lower the learning rate \(optim.lr=0.003\)"):
        trainer.step()


def test_bad_config_fails_before_any_compute(rl_setup, tmp_path):
    with pytest.raises(ConfigError, match="algorithm: 'grpo' is not allowed; choose one of bgpo, cj_grpo, "):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=grpo")))
    with pytest.raises(ConfigError,
                       match="unknown key 'num_generation' in config; did you mean 'rollout.num_generations'"):
        load_config(RLConfig, None, ["num_generation=4"])
    with pytest.raises(ConfigError, match="reference: 'base'"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "beta=0.1",
                                                           "reference=base")))
    with pytest.raises(ConfigError, match=r"eval.threshold: must be in \(0, 1\], got 1.5"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "eval.threshold=1.5")))
    with pytest.raises(ConfigError, match="rollout.steps: must be >= 1, got 0"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "rollout.steps=0")))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_checks_that_need_the_model_run_in_the_constructor(rl_setup, tmp_path, monkeypatch):
    """gen_length against the decoding block is checked before the first held-out evaluation (it used to fail
    in the sampler); scale_rewards=none is the choice 'none', not a null the preset fills with 'group'."""
    import dllm_rl.rl.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "heldout_accuracy", lambda *a, **k: pytest.fail("evaluated"))
    with pytest.raises(ConfigError, match=r"^rollout.gen_length: 6 is not a multiple of rollout.block_length \(4\)$"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "rollout.gen_length=6",
                                                           "rollout.block_length=4")))
    with pytest.raises(ConfigError, match=r"^rollout.gen_length: 6 is not a multiple of the model's block_size"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "sdar", tmp_path, "rollout.gen_length=6")))
    cfg = RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=tracerl",
                                                             "scale_rewards=none"))).cfg
    assert (cfg.scale_rewards, cfg.advantage) == ("none", "group_zscore")


def test_evaluation_keeps_its_own_decoding_schedule(rl_setup, tmp_path):
    """A faster rollout schedule does not change the held-out metric: evaluation decodes one token per step
    (8 forwards for 8 slots) unless ``eval.steps`` / ``eval.threshold`` say otherwise."""
    def heldout(*extra):  # each trainer its own run directory
        out = tmp_path / "-".join(extra or ("plain",))
        cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", out, "eval.limit=4", *extra))
        return RLTrainer(cfg).evaluate()

    plain = heldout()
    fast_rollouts = heldout("rollout.threshold=0.5", "rollout.temperature=0.7")
    assert plain.nfe_mean == fast_rollouts.nfe_mean == 8.0
    assert fast_rollouts.texts == plain.texts and len(plain.texts) == 4
    assert heldout("eval.steps=2").nfe_mean == 2.0
    assert heldout("eval.threshold=1.0").nfe_mean == 8.0  # nothing passes: one per step


def test_reference_policy_gets_no_gradient_and_stays_frozen(rl_setup, tmp_path):
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=diffu_grpo",
                                                   "beta=0.5", "train.max_steps=1"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    ref_before = {k: v.clone() for k, v in trainer.reference.hf_model.state_dict().items()}
    res = trainer.step()
    assert res.metrics["kl"] >= 0.0 and math.isfinite(res.metrics["loss"])
    assert all(p.grad is None for p in trainer.reference.parameters())
    assert all(torch.equal(v, trainer.reference.hf_model.state_dict()[k]) for k, v in ref_before.items())
    assert any(not torch.equal(v, trainer.model.hf_model.state_dict()[k]) for k, v in ref_before.items())


def test_rollouts_are_decoded_by_a_low_precision_copy_refreshed_each_step(rl_setup, tmp_path, monkeypatch):
    """rollout.dtype=bfloat16: every step decodes with a bfloat16 copy holding the policy's current weights,
    rounded; the policy stays float32 (old log-probs too: the first-pass ratio is still exactly 1), and the
    copy's rotary buffers keep the policy's dtype."""
    import dllm_rl.rl.collect as trainer_mod

    seen, real = [], trainer_mod.generate_batched

    def spy(model, *args, **kwargs):
        seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return real(model, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "generate_batched", spy)
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=espo", "train.max_steps=2",
                                                   "drop_zero_variance=false", "rollout.dtype=bfloat16"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    live = []
    for _ in range(2):
        live.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        metrics = trainer.step().metrics
        assert metrics["ratio_dev_first_update"] == 0.0 and math.isfinite(metrics["loss"])
    assert any(not torch.equal(live[0][n], live[1][n]) for n in live[0])
    for weights, decoded in zip(live, seen, strict=True):
        assert sorted(weights) == sorted(decoded)
        for n, w in weights.items():
            assert w.dtype == torch.float32 and decoded[n].dtype == torch.bfloat16
            assert torch.equal(decoded[n], w.to(torch.bfloat16)), n
    buffers = dict(trainer.rollout_copy.model.named_buffers())
    assert buffers and all(b.dtype == torch.float32 for b in buffers.values())

    same = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / "f32", "rollout.dtype=float32"))
    assert RLTrainer(same).rollout_copy is None  # the policy's own dtype: no copy
    with pytest.raises(ConfigError, match="rollout.dtype: 'int8' is not allowed; choose one of auto, float32, "
                                          "bfloat16, float16$"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "rollout.dtype=int8")))


def test_rollout_dtype_auto_takes_bfloat16_only_where_the_device_has_it(rl_setup, tmp_path, monkeypatch):
    """rollout.dtype=auto: a bfloat16 copy where native_bfloat16 finds support, no copy (the float32 policy
    decodes) where it does not; the run's log says which."""
    import dllm_rl.rl.rollout_copy as copy_mod

    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "rollout.dtype=auto"))
    monkeypatch.setattr(copy_mod, "native_bfloat16", lambda device: "AMX")
    trainer = RLTrainer(cfg)
    assert trainer.rollout_copy.model.dtype == torch.bfloat16 and trainer.model.dtype == torch.float32
    assert trainer.rollout_note == "rollout.dtype=auto: rollouts decoded by a bfloat16 copy (AMX)"
    monkeypatch.setattr(copy_mod, "native_bfloat16", lambda device: None)
    trainer.close()  # a second trainer in the same run directory: the first lets go of it
    trainer = RLTrainer(replace(cfg, run=replace(cfg.run, overwrite=True)))
    assert trainer.rollout_copy is None
    assert trainer.rollout_note == "rollout.dtype=auto: rollouts decoded in float32 (no native bfloat16 on this device)"


@needs_cxx
def test_compiled_rollout_copy_decodes_what_the_live_policy_would(rl_setup, tmp_path, monkeypatch):
    """rollout.compile=true at the policy's dtype: a copy exists only to be compiled, and each step's rollouts
    (decoded by it, refreshed) are token for token those of the uncompiled policy, as are the rewards
    (tests/rl/test_rollout_copy.py checks the refresh and the shapes on the copy alone)."""
    import dllm_rl.rl.collect as trainer_mod

    tokens, real = [], trainer_mod.generate_batched

    def spy(model, *args, **kwargs):
        out = real(model, *args, **kwargs)
        tokens.append(torch.cat([out.prompt_ids, out.completion_ids, out.step_map], 1))
        return out

    monkeypatch.setattr(trainer_mod, "generate_batched", spy)
    runs = {}
    for compiled in (False, True):
        cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path / str(compiled), "algorithm=espo",
                                                       "drop_zero_variance=false", f"rollout.compile={compiled}"))
        trainer = RLTrainer(cfg, reward_fn=digit_reward)
        tokens.clear()
        rewards = [trainer.step().metrics["reward"] for _ in range(2)]
        runs[compiled] = (trainer, [t.clone() for t in tokens], rewards)
    eager, compiled = runs[False], runs[True]
    assert eager[0].rollout_copy is None
    copy_ = compiled[0].rollout_copy
    assert copy_.model.dtype == torch.float32 and copy_.model.hf_model._compiled_call_impl is not None
    for a, b in zip(eager[1], compiled[1], strict=True):
        assert torch.equal(a, b)
    assert eager[2] == compiled[2]


def test_lora_rl_trains_only_the_adapters_against_the_base_as_reference(rl_setup, tmp_path):
    """lora.enabled with reference=base: the adapters (B starts at 0, so the first step's KL to the adapter-free
    base is exactly 0) are all that moves; the bfloat16 rollout copy follows them; final/ is merged."""
    cfg = load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", tmp_path, "algorithm=diffu_grpo", "beta=0.1", "reference=base", "lora.enabled=true",
        "lora.r=4", "train.max_steps=2", "drop_zero_variance=false", "rollout.dtype=bfloat16"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    assert trainer.reference is None
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and frozen and all("lora_" in n for n in adapters)
    kls = [trainer.step().metrics["kl"]]
    decoded_by = {n: p.detach().to(torch.bfloat16) for n, p in trainer.model.named_parameters() if p.requires_grad}
    kls.append(trainer.step().metrics["kl"])  # its rollouts: the adapters as step 1 left them
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[1] > 0.0
    now = dict(trainer.model.named_parameters())
    assert all(torch.equal(now[n], w) for n, w in frozen.items())
    moved = [n for n, w in adapters.items() if not torch.equal(now[n], w)]
    assert any("lora_B" in n for n in moved)
    copy_params = dict(trainer.rollout_copy.model.named_parameters())
    assert all(torch.equal(copy_params[n], w) for n, w in decoded_by.items())
    assert all(torch.equal(copy_params[n], w.to(torch.bfloat16)) for n, w in frozen.items())

    merged = _weights(trainer.save_final_model())
    base = _weights(rl_setup / "llada")
    assert sorted(merged) == sorted(base)  # no adapter tensors left: the published layout
    assert any(not torch.equal(merged[k], base[k]) for k in base)


def _even_target_reward(prompts, completions, target=None, **cols):
    """Signal only for prompts with an even target: their groups score 0, 1, 0, 1 (by position in the call, so
    every such group of 4 varies); odd targets score a flat 0 (a zero-variance group)."""
    return [float(i % 2) if int(t) % 2 == 0 else 0.0 for i, t in enumerate(target)]


@pytest.mark.parametrize("max_rounds", [3, 2])
def test_dynamic_sampling_refills_dropped_groups_from_the_prompt_stream(rl_setup, tmp_path, monkeypatch, max_rounds):
    """dynamic_sampling: batches of prompts_per_step prompts are rolled out until prompts_per_step groups have
    signal; the update gets the first of them in stream order, the last batch's surplus is counted and dropped,
    and every rolled-out sample has its own rollout seed (numbered on across the batches)."""
    import dllm_rl.rl.update as trainer_mod
    from dllm_rl.tasks import get_task
    from dllm_rl.training import IndexStream

    scored = []
    real = trainer_mod.estimate

    def spy(name, model, batch, gen, **opts):
        scored.append(batch.sample_seeds.tolist())
        return real(name, model, batch, gen, **opts)

    monkeypatch.setattr(trainer_mod, "estimate", spy)
    P, G = 2, 4
    cfg = load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", tmp_path, "run.seed=1", "algorithm=espo", "estimator_noise=sample", "dynamic_sampling=true",
        f"max_sampling_rounds={max_rounds}", "log.rollouts=100"))
    trainer = RLTrainer(cfg, reward_fn=_even_target_reward)
    task = get_task("countdown", data=str(rl_setup / "train.jsonl"), split="train", prompt_style="compact")
    stream = IndexStream(len(task), seed=cfg.run.seed)
    cases = []
    for step in range(3):
        trainer.step_idx = step
        # expected: draw batches of P prompts until P of them have an even target, at most max_rounds batches
        drawn, even = [], 0
        for _ in range(max_rounds):
            batch = stream.take(P)
            drawn += batch
            even += sum(task[i]["target"] % 2 == 0 for i in batch)
            if even >= P:
                break
        kept = [j for j, i in enumerate(drawn) if task[i]["target"] % 2 == 0][:P]
        cases.append((len(drawn) // P, even))
        scored.clear()
        res = trainer.step()
        m = res.metrics
        assert m["sampling_rounds"] == len(drawn) // P
        assert m["zero_variance_groups"] == sum(task[i]["target"] % 2 for i in drawn)
        assert m["surplus_groups"] == max(0, even - P)
        assert m["kept_samples"] == G * len(kept)
        # the rewards saw the drawn prompts, G rollouts each, in stream order
        texts, _, _ = trainer.prompts.task_prompts(trainer.model, task, [task[i] for i in drawn])
        assert [s[0] for s in res.samples] == [t for t in texts for _ in range(G)]
        # the update scored exactly the kept groups' samples, with the rollouts' own seeds
        want = [derive_seed(cfg.run.seed, step, 0, g * G + k) % (1 << 62) for g in kept for k in range(G)]
        assert scored and all(s == want for s in scored)
    assert trainer.stream.state_dict() == stream.state_dict()
    # seed 1's stream: a surplus group, then 3 batches for 2 groups, or (max 2 batches) a step left one short
    assert cases == ([(2, 3), (3, 2), (2, 2)] if max_rounds == 3 else [(2, 3), (2, 1), (2, 2)])


def test_dynamic_sampling_stops_after_max_sampling_rounds_and_needs_a_filter(rl_setup, tmp_path):
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "dynamic_sampling=true",
                                                   "max_sampling_rounds=3"))
    trainer = RLTrainer(cfg, reward_fn=lambda prompts, completions, **cols: [0.5] * len(completions))
    m = trainer.step().metrics
    assert (m["sampling_rounds"], m["zero_variance_groups"], m["kept_samples"], m["skipped_step"]) == (3, 6, 0, 1)
    assert trainer.stream.state_dict()["consumed"] == 6
    with pytest.raises(ConfigError, match="dynamic_sampling: refills the groups that drop_zero_variance"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "dynamic_sampling=true",
                                                           "drop_zero_variance=false")))
    with pytest.raises(ConfigError, match="max_sampling_rounds: must be >= 1, got 0"):
        RLTrainer(load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "max_sampling_rounds=0")))


def test_model_dtype_auto_loads_the_policy_in_float32_on_the_cpu(rl_setup, tmp_path):
    """model.dtype=auto (the shared dtype words) reaches the loader resolved: float32 on the CPU, as on every
    device without CUDA."""
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "model.dtype=auto"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    try:
        assert trainer.model.dtype == torch.float32
    finally:
        trainer.close()
