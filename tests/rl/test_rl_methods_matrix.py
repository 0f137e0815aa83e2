"""Every preset x every family runs 2 RL steps on tiny models: finite loss, first-update ratio exactly 1
where the method has a ratio, weights changed. The seven text families run one layer (LLaDA2 two: its first is
dense) of hidden size 16 on 1 prompt x 4 samples of 4 tokens; the image families (LLaDA-V, MMaDA) run on the
shapes task with 2 prompts of one image each (``image_rl_setup``, tests/rl/conftest.py)."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import (
    alternating_reward,
    countdown_root,
    digit_reward,
    gemma_overrides,
    image_overrides,
    rl_overrides,
    tiny_gemma,
)

from dllm_rl.config import ConfigError, load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.presets import PRESETS
from dllm_rl.rl.trainer import RLTrainer

FAMILIES = ("llada", "dream", "sdar", "llada2", "llada_moe", "sdar_moe", "fast_dllm_v2")
IMAGE_FAMILIES = ("llada_v", "mmada")


def check_first_ratio(algorithm: str, updated: list[dict]) -> None:
    """A loss with an importance ratio (its registration says, ``ratio_free``) reports the first update's ratio, which
    the common random numbers make exactly 1; a ratio-free loss reports none."""
    if POLICY_LOSSES[PRESETS[algorithm]["loss_type"]].ratio_free:
        assert all("ratio_dev_first_update" not in m for m in updated)
    else:
        assert all(m["ratio_dev_first_update"] == 0.0 for m in updated)


def two_steps_train(trainer: RLTrainer, algorithm: str, label: str) -> None:
    """Two RL steps of ``trainer`` (closed after): a step with signal, finite losses, the exact first ratio where
    the method has one, and changed weights."""
    try:
        before = [p.detach().clone() for p in trainer.model.model.parameters()]
        metrics = []
        for _ in range(2):
            metrics.append(trainer.step().metrics)
            trainer.step_idx += 1
        updated = [m for m in metrics if "loss" in m]
        assert updated, f"{label}: no step had a group with signal"
        assert all(math.isfinite(m["loss"]) for m in updated)
        check_first_ratio(algorithm, updated)
        after = list(trainer.model.model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after))
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def matrix_setup(tmp_path_factory):
    # one layer, except LLaDA2, whose first layer is dense: its second is its MoE layer
    return countdown_root(tmp_path_factory.mktemp("matrix"), FAMILIES, 16, 2, hidden_size=16, intermediate_size=32,
                          num_heads=2, num_kv_heads=1, num_layers=lambda fam: 2 if fam == "llada2" else 1)


@pytest.mark.parametrize("family", FAMILIES + IMAGE_FAMILIES)
@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_preset_runs_two_steps_on_every_family(request, tmp_path, family, algorithm):
    if family in IMAGE_FAMILIES:
        over = image_overrides(request.getfixturevalue("image_rl_setup"), family, tmp_path / "run",
                               f"algorithm={algorithm}", "eval.limit=0", "train.micro_batch_size=8")
    else:
        over = rl_overrides(request.getfixturevalue("matrix_setup"), family, tmp_path / "run",
                            f"algorithm={algorithm}", "train.prompts_per_step=1", "rollout.gen_length=4",
                            "rollout.block_length=4", "train.micro_batch_size=8")
    cfg = load_config(RLConfig, None, over)
    trainer = RLTrainer(cfg, reward_fn=alternating_reward if family in IMAGE_FAMILIES else digit_reward)
    two_steps_train(trainer, algorithm, f"{algorithm}/{family}")


# DiffusionGemma (uniform-state diffusion, no mask token): the presets whose estimator has a uniform-state counterpart
# run on it (trace -> trajectory, elbo -> uniform_elbo); every other one is refused in one line naming why
UNIFORM_RUNS = {"cj_grpo": "trajectory", "espo": "uniform_elbo", "tracerl": "trajectory"}


@pytest.fixture(scope="module")
def gemma_setup(tmp_path_factory):
    return tiny_gemma(countdown_root(tmp_path_factory.mktemp("gemma"), (), 16, 2))


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_preset_runs_or_is_refused_on_diffusion_gemma(gemma_setup, tmp_path, algorithm):
    cfg = load_config(RLConfig, None, gemma_overrides(gemma_setup, tmp_path / "run", f"algorithm={algorithm}"))
    if algorithm not in UNIFORM_RUNS:
        with pytest.raises(ConfigError) as err:
            RLTrainer(cfg, reward_fn=digit_reward)
        est = PRESETS[algorithm]["estimator"]
        why = (f"back-propagates its {algorithm} loss draw by draw over the masked rows of {est}"
               if algorithm == "bgpo" else f"scores with {est}, which masks tokens")
        assert str(err.value) == (f"algorithm={algorithm}: preset {algorithm} {why}; diffusion_gemma is "
                                  "uniform-state (no mask token): use cj_grpo, espo or tracerl")
        return
    trainer = RLTrainer(cfg, reward_fn=digit_reward)
    assert trainer.cfg.estimator == UNIFORM_RUNS[algorithm]
    two_steps_train(trainer, algorithm, algorithm)
