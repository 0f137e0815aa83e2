"""The value model on tiny models: zero start, values read at each token's commit state, a decreasing value
loss, and the learner's checks."""

import pytest
import torch

from dllm_rl.config import ConfigError
from dllm_rl.estimators import ScoringBatch, merged_steps
from dllm_rl.models import build_model, tiny_config
from dllm_rl.models.masks import position_ids_from_valid
from dllm_rl.rl.config import RLConfig, RLModelConfig, RLTrainConfig
from dllm_rl.rl.value import ValueLearner, ValueModel, token_values
from dllm_rl.rl.value_config import ValueModelConfig
from dllm_rl.training import make_accelerator

VOCAB, MASK, EOS = 64, 63, 62


def _model(family: str, seed: int = 0):
    cfg = tiny_config(family, vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, block_size=4)
    return build_model(family, cfg, seed=seed)


def _block_batch(seed: int = 0) -> ScoringBatch:
    """2 samples, prompts of 5 and 3 tokens (left-padded to 5), 8 completion tokens decoded block by block
    (blocks of 4 at absolute positions, the sampler's rule) in a random order inside each block; sample 1's
    answer ends after 5 tokens (EOS padding uncounted)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, EOS, (2, 5), generator=g)
    prompt_mask = torch.ones(2, 5, dtype=torch.bool)
    prompt_mask[1, :2] = False
    prompt[1, :2] = EOS
    comp = torch.randint(0, EOS, (2, 8), generator=g)
    comp_mask = torch.ones(2, 8, dtype=torch.bool)
    comp_mask[1, 5:] = False
    comp[1, 4:] = EOS
    step_map = torch.zeros(2, 8, dtype=torch.long)
    for b, p in enumerate((5, 3)):
        step, start = 0, 0
        while start < 8:  # completion token j sits at position p + j, in block (p + j) // 4
            end = min(8, start + 4 - (p + start) % 4)
            order = torch.randperm(end - start, generator=g)
            step_map[b, start:end] = step + order
            step, start = step + end - start, end
    return ScoringBatch(prompt, prompt_mask, comp, comp_mask, step_map)


def test_value_head_starts_at_exactly_zero():
    for family in ("llada", "dream", "sdar"):
        vm = ValueModel(_model(family))
        assert vm.head.bias is None and torch.count_nonzero(vm.head.weight) == 0
        values = token_values(vm, vm.backbone, _block_batch(), shrinkage=1)
        assert torch.count_nonzero(values) == 0


def test_block_model_values_equal_a_direct_forward_of_each_step_state():
    """Each token's value from the two-stream rows == the value at its column of a plain block-causal forward of
    [prompt | completion] with the tokens of its block committed at its step or later masked."""
    vm = ValueModel(_model("sdar"))
    with torch.no_grad():
        vm.head.weight.normal_(generator=torch.Generator().manual_seed(1))
    batch = _block_batch()
    got = token_values(vm, vm.backbone, batch, shrinkage=1)
    merged, blk = merged_steps(batch, 1, 4)
    ids_all, valid_all = batch.input_ids(), batch.valid()
    checked = 0
    for b in range(2):
        for j in range(8):
            if not batch.completion_mask[b, j]:
                assert got[b, j] == 0.0
                continue
            same = (blk[b] == blk[b, j]) & (merged[b] >= merged[b, j]) & batch.completion_mask[b]
            later = blk[b] > blk[b, j]
            comp = torch.where(same | later, MASK, batch.completion_ids[b])
            ids = torch.cat([ids_all[b, :5], comp])[None]
            valid = valid_all[b][None]
            pos = position_ids_from_valid(valid)
            with torch.no_grad():
                direct = vm(ids, vm.backbone.default_bias(valid, pos), pos)[0, 5 + j]
            torch.testing.assert_close(got[b, j], direct, rtol=0, atol=1e-5)
            checked += 1
    assert checked == 13


def _learner(family: str = "sdar", **value) -> ValueLearner:
    cfg = RLConfig(model=RLModelConfig(path="unused"), estimator="trace", estimator_options={"shrinkage": 1},
                   train=RLTrainConfig(micro_batch_size=1),
                   value_model=ValueModelConfig(enabled=True, **value))
    return ValueLearner(cfg, _model(family), make_accelerator(cpu=True))


def test_value_loss_decreases_on_a_fixed_batch():
    """Five value steps on one batch (outcome rewards 1 and 0): each step's loss, at the values it starts from,
    is below the last; the values move toward the returns within the clip range (epsilon 0.2)."""
    learner = _learner(lr=3e-3)
    assert learner.micro_batch_size == 1 and learner.lr == 3e-3
    batch, rewards = _block_batch(), torch.tensor([1.0, 0.0])
    losses = []
    for _ in range(5):
        t = learner.targets(batch, rewards)
        losses.append(learner.update(batch, t)["value_loss"])
    assert losses[0] == pytest.approx(0.5 * 8 / 13)  # values 0, returns 1 on 8 tokens and 0 on 5: 0.5 * 8/13
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    t = learner.targets(batch, rewards)
    assert float(t.old_values[0][t.mask[0]].mean()) > float(t.old_values[1][t.mask[1]].mean())


def test_process_rewards_reach_the_returns_of_their_steps():
    """Sample 1 decodes its 5 counted tokens in the order comp0, comp1, comp4, comp3, comp2 (blocks of 4 from
    position 3; see _block_batch's step_map); per-step scores [0.5, 0, 0.25] put 0.5 on comp0's step and 0.25 on
    comp4's, so at value 0 (gamma = lam = 1) the returns are 0.75, 0.25, 0, 0, 0.25. Sample 0: outcome reward 1."""
    learner = _learner()
    batch = _block_batch()
    assert batch.step_map[1, :5].tolist() == [0, 1, 4, 3, 2]
    t = learner.targets(batch, torch.tensor([1.0, 0.75]), [None, [0.5, 0.0, 0.25]])
    assert t.returns[0].tolist() == [1.0] * 8
    torch.testing.assert_close(t.returns[1], torch.tensor([0.75, 0.25, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(t.advantages, t.returns)  # V = 0


def test_learner_default_lr_and_family_check(tmp_path):
    cfg = RLConfig(model=RLModelConfig(path="unused"), estimator="trace", value_model=ValueModelConfig(enabled=True))
    cfg.optim.lr = 2e-4
    learner = ValueLearner(cfg, _model("llada"), make_accelerator(cpu=True))
    assert learner.lr == pytest.approx(1e-3) and learner.shrinkage == 1
    from dllm_rl.models import save_model
    save_model(_model("sdar"), tmp_path / "sdar")
    cfg.value_model.init_from = str(tmp_path / "sdar")
    with pytest.raises(ConfigError, match="is a sdar model and the policy a llada model; the value backbone must"):
        ValueLearner(cfg, _model("llada"), make_accelerator(cpu=True))
