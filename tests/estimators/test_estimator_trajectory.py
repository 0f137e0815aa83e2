"""The ``trajectory`` estimator (uniform-state families): a hand computation on two steps of four tokens with the
self-conditioning chain replayed, equality with the log-probabilities the sampler drew from on a real tiny rollout,
gradients, and the refusal of TraceRL's shrinkage."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from uniform_steps import two_step_record

import dllm_rl.estimators.trajectory as trajectory_module
from dllm_rl.estimators import ScoringBatch, estimate
from dllm_rl.estimators.registry import check_options
from dllm_rl.models import tiny_config
from dllm_rl.models.loading import build_model
from dllm_rl.sampling.uniform import UniformDecodeConfig, sample_uniform
from dllm_rl.sampling.uniform_rollout import UniformTrace
from dllm_rl.sampling.uniform_trace import trajectory_logprob

BASE = [torch.tensor([[2.0, 0.0, 0.0]] * 4), torch.tensor([[0.0, 1.0, 0.0]] * 4)]  # raw logits of steps 1 and 2
SC = 0.5  # the scripted decoder adds SC x its self-conditioning input


class ScriptedContext:
    """A canvas decoder whose hidden states are the logits: step ``s``'s ``BASE[s]`` (times ``w``) plus ``SC`` times
    the self-conditioning input; records each input."""

    calls: list = []

    def __init__(self, model, prompt_ids, prompt_mask):
        self.w, self.n = model.w, 0
        ScriptedContext.calls = []

    def hidden(self, canvas, self_conditioning=None, self_conditioning_mask=None):
        ScriptedContext.calls.append(self_conditioning)
        out = (self.w * BASE[self.n]).expand(canvas.shape[0], -1, -1)
        self.n += 1
        return out if self_conditioning is None else out + SC * self_conditioning

    embedding_dtype = torch.float32


def _scripted_model():
    w = torch.ones((), requires_grad=True)
    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(final_logit_softcapping=None))
    hf = SimpleNamespace(config=config, lm_head=lambda h: h, device=torch.device("cpu"))
    return SimpleNamespace(hf_model=SimpleNamespace(**vars(hf), w=w), w=w)


def _two_step_batch() -> ScoringBatch:
    """Two rows, one canvas of 4, two steps (temperatures 0.8, 0.6); row 1 stopped before step 2."""
    steps = two_step_record()
    cfg = UniformDecodeConfig(max_denoising_steps=2, t_min=0.4, t_max=0.8)
    trace = UniformTrace.from_steps(steps, 4, 4, 0, cfg)
    comp = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]])
    return ScoringBatch(torch.full((2, 1), 5), torch.ones(2, 1, dtype=torch.bool), comp,
                        torch.ones(2, 4, dtype=torch.bool), uniform=trace)


def _log_softmax(logits: list[float]) -> list[float]:
    z = math.log(sum(math.exp(v) for v in logits))
    return [v - z for v in logits]


def test_trajectory_logprob_by_hand_on_two_steps_of_four_tokens(monkeypatch):
    monkeypatch.setattr(trajectory_module, "CanvasContext", ScriptedContext)
    model, batch = _scripted_model(), _two_step_batch()
    scores = trajectory_module.trajectory_scores(model, batch, chunk_size=0)
    # step 1 (T = 0.8): logits (2, 0, 0) / 0.8; step 2 (T = 0.6): (0, 1, 0) + 0.5 x step 1's tempered logits
    t1 = [2.5, 0.0, 0.0]
    l1 = _log_softmax(t1)
    l2 = _log_softmax([(b + SC * a) / 0.6 for a, b in zip(t1, [0.0, 1.0, 0.0], strict=True)])
    row0 = l1[0] + l1[1] + l2[1] + l2[0]  # step 1 accepts draws 0, 1; step 2 accepts draws 1, 0 at positions 2, 3
    row1 = l1[0]  # stopped before step 2: one accepted draw
    assert scores.sequence_score().tolist() == pytest.approx([row0, row1], abs=1e-6)
    # the self-conditioning input of step 2 is step 1's tempered logits, detached
    first, second = ScriptedContext.calls
    assert first is None and not second.requires_grad
    assert second[0, 0].tolist() == pytest.approx(t1)
    # one column per (step, position): 2 steps x 4 columns; the transitions are the counted steps
    assert scores.logp.shape == (1, 2, 8)
    assert scores.info["transition"][0, 0].tolist() == [0, 0, -1, -1, -1, -1, 1, 1]
    assert scores.info["transition"][0, 1].tolist() == [0, -1, -1, -1, -1, -1, -1, -1]
    # gradient: only through the step's own logits (d/dw of w x BASE), not through its input
    scores.sequence_score().sum().backward()
    p1 = [math.exp(v) for v in l1]
    p2 = [math.exp(v) for v in l2]
    d1 = [(b - sum(p * x for p, x in zip(p1, [2.0, 0.0, 0.0], strict=True))) / 0.8 for b in (2.0, 0.0)]
    d2 = [(b - sum(p * x for p, x in zip(p2, [0.0, 1.0, 0.0], strict=True))) / 0.6 for b in (1.0, 0.0)]
    assert model.w.grad.item() == pytest.approx(d1[0] + d1[1] + d2[0] + d2[1] + d1[0], rel=1e-5)


CANVAS, EOS, PAD = 8, 1, 0
PROMPT = torch.randint(3, 90, (4, 5), generator=torch.Generator().manual_seed(0))
STOP = {"confidence_threshold": 0.3, "stability_threshold": 0}  # rows stop at different steps


def _tiny(scale: float):
    cfg = tiny_config("diffusion_gemma", vocab_size=96, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS)
    dlm = build_model("diffusion_gemma", cfg, seed=0)
    with torch.no_grad():
        dlm.hf_model.model.decoder.embed_tokens.weight.mul_(scale)
    return dlm


def _rollout_batch(dlm, cfg: UniformDecodeConfig, prompt: torch.Tensor, seed: int):
    rollout = sample_uniform(dlm, prompt, cfg, generator=torch.Generator().manual_seed(seed), eos_token_id=EOS,
                             pad_token_id=PAD)
    comp = rollout.completion_ids
    trace = UniformTrace.from_steps(rollout.steps, CANVAS, comp.shape[1], PAD, cfg)
    batch = ScoringBatch(prompt, torch.ones_like(prompt, dtype=torch.bool), comp, comp != PAD, uniform=trace)
    return rollout, batch


@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_the_scores_equal_the_logprobs_the_sampler_drew_from(scale):
    """A real rollout of two canvases (rows stopping early at scale 50): under the sampling policy each accepted
    draw's log-probability is the one of the logits the sampler kept (to float rounding: the scored positions are
    projected a chunk at a time), and their sum is the recorded trajectory log-probability."""
    dlm = _tiny(scale)
    cfg = UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=6, keep_logits=True, **STOP)
    rollout, batch = _rollout_batch(dlm, cfg, PROMPT, 1)
    recorded = trajectory_logprob(rollout.steps, [s.logits for s in rollout.steps])
    with torch.no_grad():
        scores = estimate(dlm, "trajectory", batch, None, logprob_chunk_size=3)
    logp, weight = scores.logp[0].view(4, len(rollout.steps), -1), scores.weight[0].view(4, len(rollout.steps), -1)
    for s, step in enumerate(rollout.steps):
        cols = slice(step.canvas_index * CANVAS, (step.canvas_index + 1) * CANVAS)
        kept = torch.log_softmax(step.logits, -1).gather(-1, step.sampled[..., None])[..., 0]
        scored = step.accepted & step.active[:, None]
        assert torch.equal(weight[:, s, cols].bool(), scored)
        assert torch.allclose(logp[:, s, cols][scored], kept[scored], rtol=0, atol=2e-6)
    assert torch.allclose(scores.sequence_score(), recorded, rtol=0, atol=1e-5)
    assert scores.forwards == sum(4 for s in rollout.steps if s.active.any())
    if scale == 50.0:
        assert sum(bool(s.stopped.any()) for s in rollout.steps) >= 2


def test_rows_of_two_rollout_batches_score_as_each_batch_alone():
    dlm = _tiny(50.0)
    cfg = UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=6, **STOP)
    _, a = _rollout_batch(dlm, cfg, PROMPT[:2], 1)
    _, b = _rollout_batch(dlm, cfg, PROMPT[2:, 1:], 2)  # a narrower prompt: left-padded when the rows are joined
    pad_b = torch.nn.functional.pad(b.prompt_ids, (1, 0), value=PAD)
    joined = ScoringBatch(torch.cat([a.prompt_ids, pad_b]),
                          torch.cat([a.prompt_mask, torch.nn.functional.pad(b.prompt_mask, (1, 0), value=False)]),
                          torch.cat([a.completion_ids, b.completion_ids]),
                          torch.cat([a.completion_mask, b.completion_mask]),
                          uniform=UniformTrace.cat([a.uniform, b.uniform], 2 * CANVAS, PAD))
    with torch.no_grad():
        alone = torch.cat([estimate(dlm, "trajectory", x, None).sequence_score() for x in (a, b)])
        together = estimate(dlm, "trajectory", joined, None).sequence_score()
    assert torch.equal(together, alone)


def test_gradients_reach_the_shared_layers_and_the_self_conditioning_module():
    dlm = _tiny(1.0)
    cfg = UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=3)
    _, batch = _rollout_batch(dlm, cfg, PROMPT[:2], 0)
    estimate(dlm, "trajectory", batch, None).sequence_score().sum().backward()
    grads = {name: p.grad for name, p in dlm.hf_model.named_parameters() if p.grad is not None}
    assert any("encoder.language_model.layers." in n and g.abs().sum() > 0 for n, g in grads.items())
    assert any("decoder.self_conditioning." in n and g.abs().sum() > 0 for n, g in grads.items())


def test_shrinkage_has_no_uniform_state_form():
    with pytest.raises(ValueError, match="^shrinkage must be 1 for the trajectory estimator, got 8: each step"):
        check_options("trajectory", {"shrinkage": 8})
    with pytest.raises(ValueError, match="unknown option"):
        check_options("trajectory", {"num_mc": 2})


def test_a_backward_by_steps_has_the_all_at_once_gradient(monkeypatch):
    """Two canvases, rows stopping early: back-propagating sum(logp * G) two replayed steps at a time gives the
    gradient of one backward over every step (to float32 rounding: the MoE's grouped matmul takes no float64), no
    chunk holds more than two decoder steps' graphs, and only the last chunk is told it is the last."""
    dlm = _tiny(50.0)
    cfg = UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=5, **STOP)
    _, batch = _rollout_batch(dlm, cfg, PROMPT[:3], 1)
    scores = estimate(dlm, "trajectory", batch, None)
    grad_out = torch.randn(scores.logp.shape, generator=torch.Generator().manual_seed(0))
    (scores.logp * grad_out * scores.weight).sum().backward()
    whole = {n: p.grad.clone() for n, p in dlm.hf_model.named_parameters() if p.grad is not None}
    dlm.zero_grad(set_to_none=True)
    events, hidden = [], trajectory_module.CanvasContext.hidden

    def counted(self, *args, **kwargs):
        events.append("step")
        return hidden(self, *args, **kwargs)

    def backward(term, last):
        events.append(("backward", last))
        term.backward()

    monkeypatch.setattr(trajectory_module.CanvasContext, "hidden", counted)
    chunks = trajectory_module.backward_by_steps(dlm, batch, grad_out * scores.weight, 2, backward)
    parts = "".join("s" if e == "step" else "|" for e in events).split("|")[:-1]
    assert chunks == len(parts) >= 3 and all(1 <= len(p) <= 2 for p in parts)
    assert [e[1] for e in events if e != "step"] == [False] * (chunks - 1) + [True]
    chunked = {n: p.grad for n, p in dlm.hf_model.named_parameters() if p.grad is not None}
    assert chunked.keys() == whole.keys()
    for name, g in whole.items():
        torch.testing.assert_close(chunked[name], g, rtol=1e-4, atol=1e-5 * float(g.abs().max()))
