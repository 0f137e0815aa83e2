"""RL on a uniform-state family (DiffusionGemma): `dllm-rl rl` runs of 2 steps with tracerl and espo on a tiny
checkpoint that resume, an off-policy pass whose first ratio is exactly 1, and the one-line refusals (masked-decoding
keys, the value model, TraceRL's shrinkage, the uniform knobs on a masked family, a tokenizer's mask)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from rl_helpers import countdown_root, digit_reward, gemma_overrides, rl_overrides, tiny_gemma

from dllm_rl.cli import main
from dllm_rl.config import ConfigError, load_config
from dllm_rl.errors import UserError
from dllm_rl.models import char_tokenizer
from dllm_rl.models.tokenizer import check_tokenizer, load_tokenizer
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_gemma(countdown_root(tmp_path_factory.mktemp("gemma_rl"), ("llada",), 16, 2, hidden_size=16,
                                     intermediate_size=32, num_heads=2, num_kv_heads=1, num_layers=1))


def _metrics(out) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["tracerl", "espo"])
def test_cli_rl_runs_two_steps_and_resumes(root, tmp_path, algorithm):
    out, config = tmp_path / "run", tmp_path / "rl.yaml"
    config.write_text(f"algorithm: {algorithm}\n")
    common = [str(config), *gemma_overrides(root, out, "run.save_every=1",
                                            "reward.function=rl_helpers:alternating_reward")]
    assert main(["rl", *common, "train.max_steps=2"]) == 0
    steps = [m for m in _metrics(out) if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in steps)
    assert (out / "checkpoints" / "step-0000002").is_dir()
    assert main(["rl", *common, "train.max_steps=3", "run.resume=latest"]) == 0
    assert [m["step"] for m in _metrics(out) if "reward" in m] == [1, 2, 3]


def test_an_off_policy_pass_starts_from_ratio_one(root, tmp_path):
    """Two passes over the rollouts: the old scores are computed apart from the current ones, and at the first
    micro-batch they are equal (the replayed self-conditioning chain is the sampler's under the same weights)."""
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / "run", "algorithm=tracerl",
                                                      "train.num_iterations=2", "train.micro_batch_size=2"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    try:
        metrics = [trainer.step().metrics for _ in range(2)]
        updated = [m for m in metrics if "loss" in m]
        assert updated and all(m["ratio_dev_first_update"] == 0.0 for m in updated)
        assert trainer.cfg.estimator == "trajectory" and trainer.cfg.estimator_options == {}
    finally:
        trainer.close()


def test_tracerl_with_the_value_model_trains_policy_and_values(root, tmp_path):
    """TraceRL's value model over the trajectory's steps: the first step's values are exactly 0 (A = R), both steps
    have finite policy and value losses, and the policy, the value head and the value backbone all move."""
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / "run", "algorithm=tracerl",
                                                      "value_model.enabled=true", "value_model.lr=0.01",
                                                      "value_model.step_chunk_size=2", "drop_zero_variance=false"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    try:
        policy = [p.detach().clone() for p in trainer.model.model.parameters()]
        value = {n: p.detach().clone() for n, p in trainer.value.model.named_parameters()}
        metrics = []
        for _ in range(2):
            metrics.append(trainer.step().metrics)
            trainer.step_idx += 1
        assert all(math.isfinite(m[k]) for m in metrics for k in ("loss", "value_loss"))
        assert metrics[0]["value_mean"] == 0.0 and metrics[1]["value_mean"] != 0.0
        assert metrics[0]["token_adv_mean"] == pytest.approx(metrics[0]["return_mean"])
        assert any(not torch.equal(a, b) for a, b in zip(policy, trainer.model.model.parameters()))
        moved = {n for n, p in trainer.value.model.named_parameters() if not torch.equal(p, value[n])}
        assert "head.weight" in moved and any(n.startswith("backbone.") for n in moved)
    finally:
        trainer.close()


def test_a_step_chunked_update_moves_the_policy_as_the_whole_one(root, tmp_path):
    """``train.step_chunk_size=1``: each replayed step back-propagated alone gives the update of one backward over
    every step (the same loss and gradient norm, and the same weights after the step, to float rounding)."""
    runs = {}
    for chunk in (0, 1):
        cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / str(chunk), "algorithm=tracerl",
                                                          f"train.step_chunk_size={chunk}", "drop_zero_variance=false"))
        trainer = RLTrainer(cfg, reward_fn=digit_reward)
        try:
            start = [p.detach().clone() for p in trainer.model.model.parameters()]
            metrics = trainer.step().metrics
            runs[chunk] = (metrics, start, [p.detach().clone() for p in trainer.model.model.parameters()])
        finally:
            trainer.close()
    (whole, start, after), (chunked, _, chunked_after) = runs[0], runs[1]
    assert chunked["loss"] == whole["loss"] and chunked["ratio_dev_first_update"] == 0.0
    assert whole["grad_norm"] > 0 and chunked["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(start, after))
    for a, b in zip(after, chunked_after):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_engine_rollouts_train_as_fixed_batch_rollouts(root, tmp_path):
    """``rollout.engine=true``: the engine gives every rollout the tokens and trajectory a fixed batch gives it, so a
    TraceRL step sees the same rewards and (up to float rounding of other batch shapes) the same loss."""
    runs = {}
    for engine in ("false", "true"):
        cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / engine, "algorithm=tracerl",
                                                f"rollout.engine={engine}", "rollout.batch_size=3"))
        trainer = RLTrainer(cfg, reward_fn=digit_reward)
        try:
            runs[engine] = trainer.step().metrics
        finally:
            trainer.close()
    fixed, engine = runs["false"], runs["true"]
    for key in ("reward", "nfe", "completion_length", "neg_logp"):
        assert engine[key] == pytest.approx(fixed[key], rel=1e-5), key
    assert math.isfinite(engine["loss"]) and engine["loss"] == pytest.approx(fixed["loss"], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(("extra", "message"), [
    (("rollout.temperature=0.5",), "rollout.temperature=0.5 is a masked-diffusion option; diffusion_gemma is "
     "uniform-state diffusion (no mask token) and decodes with rollout.gen_length and rollout.max_denoising_steps, "
     "rollout.t_min, rollout.t_max, rollout.entropy_bound, rollout.stability_threshold, rollout.confidence_threshold, "
     "rollout.final_tokens: drop rollout.temperature"),
    (("eval.steps=2",), "eval.steps=2 is a masked-diffusion option; diffusion_gemma is uniform-state diffusion"),
    (("rollout.gen_length=6",), "rollout.gen_length: 6 is not a multiple of the model's canvas_length (4); "
     "diffusion_gemma decodes whole canvases"),
    (("rollout.t_min=0.9",), "rollout.t_max: must be above t_min (0.9)"),
    (("eval.t_max=0.3",), "eval.t_max: must be above t_min (0.4)"),
    (("algorithm=tracerl", "value_model.enabled=true", "value_model.shrinkage=2"), "value_model.shrinkage: 2 merges "
     "decoding steps; diffusion_gemma is uniform-state and its value model reads each step at its own canvas"),
    (("algorithm=tracerl", "loss_type=bgpo", "train.step_chunk_size=2"), "train.step_chunk_size: the bgpo loss is "
     "back-propagated one draw at a time, not by replayed steps: set train.step_chunk_size=0"),
    (("algorithm=espo", "train.step_chunk_size=2"), "train.step_chunk_size: back-propagates the steps the trajectory "
     "estimator replays; estimator=uniform_elbo replays none: set train.step_chunk_size=0"),
    (("algorithm=tracerl", "estimator_options={shrinkage: 8}"), "estimator_options: shrinkage must be 1 for the "
     "trajectory estimator, got 8: each step of a uniform-state trajectory is scored at its own canvas"),
    (("algorithm=tracerl", "estimator=trace"), "estimator 'trace' scores masked diffusion; diffusion_gemma is "
     "uniform-state: use 'trajectory' or 'uniform_denoise' or 'uniform_elbo'"),
])
def test_uniform_refusals_are_one_line(root, tmp_path, extra, message):
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / "run", *extra))
    with pytest.raises(UserError) as err:
        RLTrainer(cfg, reward_fn=digit_reward)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_masked_family_refuses_the_uniform_knobs(root, tmp_path):
    cfg = load_config(RLConfig, None, rl_overrides(root, "llada", tmp_path / "run", "rollout.max_denoising_steps=3"))
    with pytest.raises(ConfigError) as err:
        RLTrainer(cfg, reward_fn=digit_reward)
    assert str(err.value) == ("rollout.max_denoising_steps=3 is a uniform-state diffusion option (DiffusionGemma); "
                              "llada is masked diffusion: drop rollout.max_denoising_steps")


def test_the_held_out_evaluation_decodes_at_its_own_temperatures(root, tmp_path):
    """eval.t_min / eval.t_max / eval.entropy_bound set the evaluation's sampler only (rollouts explore hotter than
    the metric decodes);
    unset, the evaluation decodes as the rollouts; a masked family refuses them."""
    from dllm_rl.rl.config import decode_config

    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / "run", "rollout.t_max=1.2", "rollout.t_min=0.8",
                                                      "rollout.entropy_bound=1.0", "eval.t_max=0.6", "eval.t_min=0.3",
                                                      "eval.entropy_bound=0.1"))
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    try:
        rollout, held_out = decode_config(cfg, trainer.model), decode_config(cfg, trainer.model, evaluation=True)
    finally:
        trainer.close()
    assert (rollout.t_max, rollout.t_min, held_out.t_max, held_out.t_min) == (1.2, 0.8, 0.6, 0.3)
    assert (rollout.entropy_bound, held_out.entropy_bound) == (1.0, 0.1)
    assert held_out.max_denoising_steps == rollout.max_denoising_steps
    cfg = load_config(RLConfig, None, rl_overrides(root, "llada", tmp_path / "run2", "eval.t_max=0.6"))
    with pytest.raises(ConfigError) as err:
        RLTrainer(cfg, reward_fn=digit_reward)
    assert str(err.value) == ("eval.t_max=0.6 is a uniform-state diffusion option (DiffusionGemma); llada is masked "
                              "diffusion: drop eval.t_max")


def test_a_uniform_family_needs_no_mask_token_in_its_tokenizer(tmp_path):
    tok = char_tokenizer()
    tok.mask_token = None
    tok.save_pretrained(tmp_path / "tok")
    assert load_tokenizer(tmp_path / "tok", noise="uniform").mask_token_id is None
    with pytest.raises(UserError, match="tokenizer has no mask token; a masked diffusion LM needs one"):
        load_tokenizer(tmp_path / "tok")
    check_tokenizer(tok, None, noise="uniform")  # nothing to refuse


@pytest.mark.parametrize("backend", ["zero2", "zero3"])
def test_sharded_backends_are_refused_in_one_line(root, tmp_path, monkeypatch, backend):
    """DDP and FSDP2 run a uniform-state model (tests/scale/test_sharded_trainers.py); ZeRO is refused by name."""
    import dllm_rl.rl.trainer as rl_trainer

    monkeypatch.setattr(rl_trainer, "setup_backend", lambda *a, **k: backend)
    cfg = load_config(RLConfig, None, gemma_overrides(root, tmp_path / "run", "algorithm=tracerl"))
    with pytest.raises(ConfigError) as err:
        RLTrainer(cfg, reward_fn=digit_reward)
    assert str(err.value) == (f"model.path: a diffusion_gemma model trains with RL in one process, under DDP or "
                              f"FSDP2, not {backend} (its estimators call the encoder and decoder directly); launch "
                              "with configs/accelerate/ddp.yaml or fsdp2.yaml")
