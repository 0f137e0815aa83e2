"""The uniform-state sampler (DiffusionGemma) against the stock ``generate``: the same tokens and step counts under
the same seed, and the trajectory log-probability recomputed from its record."""

from __future__ import annotations

import math

import pytest
import torch
from uniform_steps import two_step_record

from dllm_rl.config import FieldError
from dllm_rl.models import tiny_config
from dllm_rl.models.loading import build_model
from dllm_rl.sampling.uniform import (
    UniformDecodeConfig,
    entropy_bound_accept,
    sample_uniform,
    temperature,
)
from dllm_rl.sampling.uniform_trace import replay_logits, step_logprob, trajectory_logprob

EOS, PAD, CANVAS = 1, 0, 8


def model(scale: float = 1.0):
    """A tiny DiffusionGemma; ``scale`` multiplies the (tied) embedding, so the logits sharpen and rows may stop
    early (no greedy mode exists in the stock sampler: its temperature never reaches 0)."""
    cfg = tiny_config("diffusion_gemma", vocab_size=96, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS)
    dlm = build_model("diffusion_gemma", cfg, seed=0)
    with torch.no_grad():
        dlm.hf_model.model.decoder.embed_tokens.weight.mul_(scale)
    return dlm


PROMPT = torch.randint(3, 90, (4, 5), generator=torch.Generator().manual_seed(0))


def _both(dlm, batch: int, seed: int, **kw):
    knobs = dict(max_new_tokens=2 * CANVAS, max_denoising_steps=6, **kw)
    torch.manual_seed(seed)
    stock = dlm.hf_model.generate(PROMPT[:batch], eos_token_id=EOS, pad_token_id=PAD, **knobs)
    torch.manual_seed(seed)
    ours = sample_uniform(dlm, PROMPT[:batch], UniformDecodeConfig(**knobs), eos_token_id=EOS, pad_token_id=PAD)
    return stock, ours


def _stock_passes(stock, ours) -> list[int]:
    """The stock ``decoder_forward_passes`` per row, read back from ``tokens_per_forward`` (non-pad tokens / passes)."""
    valid = (ours.completion_ids != PAD).sum(-1)
    return [round(v / t) for v, t in zip(valid.tolist(), stock.tokens_per_forward.tolist(), strict=True)]


STOP = {"confidence_threshold": 0.3, "stability_threshold": 0}  # rows stop at different steps, some for long


@pytest.mark.parametrize(("batch", "scale", "seed", "kw", "passes"), [
    (1, 1.0, 0, {}, [12]), (4, 1.0, 1, {}, [12, 12, 12, 12]), (4, 5.0, 1, {}, [12, 12, 6, 12]),
    (4, 50.0, 1, {"confidence_threshold": 0.5}, [11, 12, 12, 12]), (4, 50.0, 1, STOP, [6, 7, 12, 6]),
], ids=["batch1", "batch4", "eos-in-first-canvas", "adaptive-stop", "stop-on-confidence"])
def test_tokens_and_step_counts_equal_stock_generate(batch, scale, seed, kw, passes):
    stock, ours = _both(model(scale), batch, seed, **kw)
    assert ours.sequences.shape[0] == batch
    assert torch.equal(ours.sequences, stock.sequences)
    assert ours.forward_passes.tolist() == _stock_passes(stock, ours) == passes
    if scale == 5.0:  # row 2 ends in its first canvas: pad after its EOS, then a second canvas of pad
        first, second = ours.completion_ids[2, :CANVAS], ours.completion_ids[2, CANVAS:]
        eos_at = first.tolist().index(EOS)
        assert (first[eos_at + 1:] == PAD).all() and (second == PAD).all()


def test_a_generator_draws_what_the_global_generator_draws():
    dlm = model()
    cfg = UniformDecodeConfig(max_new_tokens=CANVAS, max_denoising_steps=3)
    torch.manual_seed(7)
    a = sample_uniform(dlm, PROMPT[:2], cfg)
    b = sample_uniform(dlm, PROMPT[:2], cfg, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.sequences, b.sequences)


def test_the_record_holds_each_steps_canvas_draws_and_acceptance():
    dlm = model()
    rollout = sample_uniform(dlm, PROMPT[:2], UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=3),
                             generator=torch.Generator().manual_seed(3))
    steps = rollout.steps
    assert [(s.canvas_index, s.step, s.self_conditioned) for s in steps] == [
        (0, 3, False), (0, 2, True), (0, 1, True), (1, 3, False), (1, 2, True), (1, 1, True)]
    for before, after in zip(steps[:2], steps[1:3], strict=True):  # accepted draws are the next step's input there
        assert torch.equal(after.canvas[before.accepted], before.sampled[before.accepted])
    assert all(s.accepted.any(-1).all() and s.logits is None for s in steps)


def test_entropy_bound_accepts_the_lowest_entropies_while_the_bound_holds():
    entropy = torch.tensor([[0.30, 0.01, 0.05, 0.02]])
    # sorted 0.01, 0.02, 0.05, 0.30: cumsum - current = 0, 0.01, 0.03, 0.08 -> all <= 0.05 but the last
    assert entropy_bound_accept(entropy, 0.05).tolist() == [[False, True, True, True]]
    assert entropy_bound_accept(entropy, 0.005).tolist() == [[False, True, False, False]]


def test_trajectory_logprob_by_hand_on_two_steps_of_four_tokens():
    """A scripted two-step case: vocabulary 3, canvas 4, temperatures 0.8 then 0.4 (t_min 0.4, t_max 0.8, 2 steps).
    Only accepted draws count; the second row stopped before step 2, so step 2 adds nothing for it."""
    cfg = UniformDecodeConfig(max_denoising_steps=2, t_min=0.4, t_max=0.8)
    raw = [torch.tensor([[[2.0, 0.0, 0.0]] * 4] * 2), torch.tensor([[[0.0, 1.0, 0.0]] * 4] * 2)]
    steps = two_step_record()
    assert [float(temperature(cfg, s.step)) for s in steps] == pytest.approx([0.8, 0.6])
    tempered = [r / temperature(cfg, s.step) for r, s in zip(raw, steps, strict=True)]
    got = trajectory_logprob(steps, tempered)
    # step 1 (T=0.8): logits 2.5, 0, 0 -> log p(0) = 2.5 - log(e^2.5 + 2), log p(1) = -log(e^2.5 + 2)
    z1 = math.log(math.exp(2.5) + 2)
    # step 2 (T=0.6): logits 0, 1/0.6, 0 -> log p(1) = 1/0.6 - log(e^(1/0.6) + 2), log p(0) = -log(e^(1/0.6) + 2)
    z2 = math.log(math.exp(1 / 0.6) + 2)
    row0 = (2.5 - z1) + (-z1) + (1 / 0.6 - z2) + (-z2)
    row1 = 2.5 - z1
    assert got.tolist() == pytest.approx([row0, row1], abs=1e-5)
    assert step_logprob(steps[1], tempered[1]).tolist() == pytest.approx([1 / 0.6 - 2 * z2, 0.0], abs=1e-5)


@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_recomputed_logprobs_equal_the_ones_recorded_while_sampling(scale):
    """A real rollout of two canvases (rows stopping for several steps at scale 50): logits replayed from the record
    equal the kept ones bit for bit, and so do the trajectory log-probabilities."""
    cfg = UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=6, keep_logits=True, **STOP)
    dlm = model(scale)
    rollout = sample_uniform(dlm, PROMPT, cfg, generator=torch.Generator().manual_seed(1), eos_token_id=EOS,
                             pad_token_id=PAD)
    replayed = list(replay_logits(dlm, rollout, cfg))
    assert len(replayed) == len(rollout.steps) and rollout.steps[0].logits is not None
    stopped_twice = sum(bool(s.stopped.any()) for s in rollout.steps) >= 2  # stopped rows carry their logits
    assert stopped_twice == (scale == 50.0)
    for step, logits in zip(rollout.steps, replayed, strict=True):
        assert torch.equal(logits, step.logits)
    recorded = trajectory_logprob(rollout.steps, [s.logits for s in rollout.steps])
    assert torch.equal(trajectory_logprob(rollout.steps, replayed), recorded)
    assert (recorded < 0).all()


def test_the_temperature_schedule_must_decrease():
    with pytest.raises(FieldError, match="t_max"):
        UniformDecodeConfig(t_min=0.8, t_max=0.4)
