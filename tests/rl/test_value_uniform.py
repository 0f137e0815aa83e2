"""TraceRL's value model over the steps of a uniform-state trajectory (DiffusionGemma, dllm_rl.rl.value_uniform):
zero start, the (step, position) each value is read at on the scripted two-step record, the step ranks and GAE
targets, no projection onto the vocabulary, and a chunked update whose gradient is the unchunked one."""

from __future__ import annotations

import pytest
import torch
from uniform_steps import two_step_record

from dllm_rl.estimators import ScoringBatch
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.config import RLConfig, RLModelConfig
from dllm_rl.rl.value import UniformReading, ValueLearner, ValueModel
from dllm_rl.rl.value_config import ValueModelConfig
from dllm_rl.rl.value_uniform import uniform_step_ranks, uniform_value_chunks
from dllm_rl.sampling.uniform_rollout import UniformTrace
from dllm_rl.training import make_accelerator

VOCAB, PAD = 32, 0


def _gemma(seed: int = 0):
    cfg = tiny_config("diffusion_gemma", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=2, block_size=4)
    return build_model("diffusion_gemma", cfg, seed=seed)


def _batch() -> ScoringBatch:
    """The scripted two-step record (tests/uniform_steps.py), its second step fed another canvas: row 0 accepts
    positions 0-1 at step 0 and 2-3 at step 1; row 1 accepts position 0 at step 0 and is stopped at step 1."""
    steps = two_step_record()
    steps[0].canvas = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    steps[1].canvas = torch.tensor([[3, 4, 13, 14], [15, 16, 17, 18]])
    trace = UniformTrace.from_steps(steps, 4, 4, PAD)
    prompt = torch.tensor([[PAD, 20, 21], [22, 23, 24]])
    return ScoringBatch(prompt, prompt != PAD, torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]]),
                        torch.ones(2, 4, dtype=torch.bool), uniform=trace)


def _learner(backbone, **value) -> ValueLearner:
    cfg = RLConfig(model=RLModelConfig(path="unused"), estimator="trajectory",
                   value_model=ValueModelConfig(enabled=True, **value))
    return ValueLearner(cfg, backbone, make_accelerator(cpu=True))


def test_uniform_values_start_at_exactly_zero_without_the_lm_head():
    learner = _learner(_gemma())
    assert isinstance(learner.reading, UniformReading)
    calls = []
    learner.backbone.hf_model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    values = learner.values(_batch())
    assert values.shape == (2, 2 * 4) and torch.count_nonzero(values) == 0
    t = learner.targets(_batch(), torch.tensor([1.0, 0.0]))
    learner.update(_batch(), t)
    assert calls == []  # the value reads hidden states: nothing is projected onto the vocabulary


def test_each_value_is_read_at_its_step_canvas_and_accepted_position():
    """A recording stand-in for the value model returns 10 * (its call) + position: each accepted draw's column
    s * G + g holds the value of the forward over step s's canvas at position g; the stopped row's step has none."""
    backbone, seen = _gemma(), []

    def module(canvas, context):
        seen.append((canvas.clone(), context.length))
        return (10.0 * len(seen) + torch.arange(4.0)).expand(canvas.shape[0], 4)

    (values, cols), = list(uniform_value_chunks(module, backbone, _batch()))
    assert [c.tolist() for c, _ in seen] == [[[5, 6, 7, 8], [9, 10, 11, 12]], [[3, 4, 13, 14], [15, 16, 17, 18]]]
    assert [n for _, n in seen] == [3, 3]  # read against the 3-token prompt's encoder cache
    assert values.tolist() == [[10, 11, 0, 0, 0, 0, 22, 23], [10, 0, 0, 0, 0, 0, 0, 0]]
    assert cols.tolist() == [[True, True, False, False, False, False, True, True], [True] + [False] * 7]
    rank, num = uniform_step_ranks(_batch())
    assert rank.tolist() == [[0, 0, -1, -1, -1, -1, 1, 1], [0, -1, -1, -1, -1, -1, -1, -1]]
    assert num.tolist() == [2, 1]
    seen.clear()
    chunks = list(uniform_value_chunks(module, backbone, _batch(), chunk=1))  # one step per chunk, same values
    assert len(chunks) == 2 and sum(v for v, _ in chunks).tolist() == values.tolist()


def test_uniform_targets_share_each_step_and_put_the_reward_on_the_last():
    """Zero values, gamma = lam = 1: every accepted draw's return and advantage is its row's reward; a GAE with
    gamma = 0.5 halves row 0's first step (two steps) and leaves row 1's only step."""
    t = _learner(_gemma(), gamma=0.5, lam=1.0).targets(_batch(), torch.tensor([1.0, 2.0]))
    assert t.mask.tolist() == [[True, True, False, False, False, False, True, True], [True] + [False] * 7]
    assert t.returns.tolist() == [[0.5, 0.5, 0, 0, 0, 0, 1, 1], [2, 0, 0, 0, 0, 0, 0, 0]]
    assert t.advantages.tolist() == t.returns.tolist()


def test_a_chunked_value_update_has_the_unchunked_gradient():
    batch, rewards = _batch(), torch.tensor([1.0, -1.0])
    grads = []
    for chunk in (1, 8):
        learner = _learner(_gemma(), step_chunk_size=chunk, max_grad_norm=None)  # the raw gradients
        with torch.no_grad():  # a head that is not zero, so the backbone has a gradient too
            learner.model.head.weight.copy_(torch.linspace(-1, 1, 16)[None])
        t = learner.targets(batch, rewards)
        learner.optimizer.step = lambda: None  # keep the gradients of the first pass
        learner.optimizer.zero_grad = lambda **k: None
        learner.update(batch, t)
        grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(n.startswith("backbone.") for n in grads[0])
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-5 * float(g.abs().max()))


def test_the_uniform_value_head_is_zero_and_bias_free():
    vm = ValueModel(_gemma())
    assert vm.head.bias is None and torch.count_nonzero(vm.head.weight) == 0


def test_value_shrinkage_is_refused_for_a_uniform_family():
    from dllm_rl.config import ConfigError
    from dllm_rl.models.families import get_family
    from dllm_rl.rl.algorithms import resolve

    cfg = RLConfig(model=RLModelConfig(path="x"), algorithm="tracerl",
                   value_model=ValueModelConfig(enabled=True, shrinkage=2))
    with pytest.raises(ConfigError) as err:
        resolve(cfg, "block", get_family("diffusion_gemma"))
    assert str(err.value).startswith("value_model.shrinkage: 2 merges decoding steps; diffusion_gemma is "
                                     "uniform-state")
