"""The uniform-state ELBO (``uniform_elbo``): its integrand against the discrete-time KL it is the limit of, its
identities, the Monte-Carlo estimator's mean against the exact expectation, and the estimator on a tiny
DiffusionGemma; the registry's refusal of an estimator of the other noise kind."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dllm_rl.errors import UserError
from dllm_rl.estimators import ScoringBatch, estimate, estimator_forwards, estimator_options
from dllm_rl.estimators.uniform_elbo import elbo_scores, nelbo_integrand
from dllm_rl.models import tiny_config
from dllm_rl.models.loading import build_model
from dllm_rl.sampling.uniform import UniformDecodeConfig, sample_uniform

V = 3


def _discrete_kl_rate(p: np.ndarray, x: int, i: int, t: float, dt: float) -> float:
    """``KL(q(z_s | z_t = i, x) || q(z_s | z_t = i, x := p)) / dt`` at ``s = t - dt``, written from the transition
    matrices alone (Bayes' rule): the discrete-time term whose ``dt -> 0`` limit is the continuous integrand."""
    a_t, a_s = 1 - t, 1 - (t - dt)
    a_ts = a_t / a_s
    trans = a_ts * np.eye(V) + (1 - a_ts) / V  # trans[j, i] = q(z_t = i | z_s = j)

    def posterior(vec):
        prior = a_s * vec + (1 - a_s) / V  # q(z_s | x = vec)
        joint = trans[:, i] * prior
        return joint / joint.sum()

    q, m = posterior(np.eye(V)[x]), posterior(p)
    return float(np.sum(q * np.log(q / m)) / dt)


@pytest.mark.parametrize("t", [0.05, 0.4, 0.9])
def test_integrand_is_the_limit_of_the_discrete_time_kl(t):
    p = np.array([0.6, 0.3, 0.1])
    logits = torch.tensor(np.log(p), dtype=torch.float32)
    for x, i in itertools.product(range(V), range(V)):
        ours = nelbo_integrand(logits[None], torch.tensor([x]), torch.tensor([i]), torch.tensor([t]))
        want = _discrete_kl_rate(p, x, i, t, 1e-6)
        assert ours.item() == pytest.approx(want, rel=2e-3, abs=1e-5), (x, i)


def test_integrand_identities():
    clean = torch.tensor([0, 1, 2, 2])
    noisy = torch.tensor([0, 2, 2, 1])
    t = torch.tensor([0.3, 0.6, 0.0, 0.99])
    perfect = torch.nn.functional.one_hot(clean, V).float() * 60 - 30  # the clean id, p = 1 - 2e-26
    assert nelbo_integrand(perfect, clean, noisy, t).abs().max().item() < 1e-6
    # t -> 0: z_t is the clean token and g = (1/V)(1/p_x - 1) (the model's rate of jumping away from x)
    p = torch.tensor([[0.5, 0.25, 0.25]])
    g0 = nelbo_integrand(p.log(), torch.tensor([1]), torch.tensor([1]), torch.tensor([0.0]))
    assert g0.item() == pytest.approx((1 / 0.25 - 1) / V, rel=1e-6)
    # a uniform denoiser: the model's reverse rates are the forward's, any state gives the same g >= 0
    flat = torch.zeros(4, V)
    assert (nelbo_integrand(flat, clean, noisy, t) >= 0).all()


class Scripted:
    """One canvas of two positions whose denoiser reads the whole noisy canvas: logits of position ``l`` are
    ``table[l, z_other]``; the interface of :class:`~dllm_rl.estimators.canvases.ModelCanvases`."""

    width, vocab, num, embedding_dtype = 2, V, 1, torch.float32

    def __init__(self, batch, table):
        self.batch, self.table = batch, table

    def __iter__(self):
        yield 0, self.batch.completion_ids, self.batch.completion_mask

    def hidden(self, noisy, self_conditioning=None, self_conditioning_mask=None):
        return torch.stack([self.table[0][noisy[:, 1]], self.table[1][noisy[:, 0]]], dim=1)

    def head(self, hidden):
        return hidden.float()


TABLE = torch.tensor([[[2.0, 0.1, -1.0], [0.0, 1.0, 0.5], [-0.5, 0.2, 1.5]],
                      [[0.3, -0.4, 1.2], [1.0, 1.0, -2.0], [0.1, 2.0, 0.0]]])
CLEAN = (2, 0)


def _exact_elbo() -> float:
    """``-int_0^1 sum_{z} q_t(z | x) sum_l g_l(z) dt``: every noisy canvas enumerated, Gauss-Legendre over t."""
    nodes, wts = np.polynomial.legendre.leggauss(64)
    total = 0.0
    for node, w in zip(nodes, wts, strict=True):
        t = 0.5 * (node + 1)
        inner = 0.0
        for z in itertools.product(range(V), repeat=2):
            q = np.prod([(1 - t) * (z[l] == CLEAN[l]) + t / V for l in range(2)])
            logits = Scripted(None, TABLE).hidden(torch.tensor([z]))[0]
            g = nelbo_integrand(logits, torch.tensor(CLEAN), torch.tensor(z), torch.full((2,), t))
            inner += q * g.double().sum().item()
        total += 0.5 * w * inner
    return -total


def _batch(n: int, seeds: bool = False) -> ScoringBatch:
    comp = torch.tensor([CLEAN] * n)
    return ScoringBatch(torch.full((n, 1), 5), torch.ones(n, 1, dtype=torch.bool), comp,
                        torch.ones_like(comp, dtype=torch.bool),
                        sample_seeds=torch.arange(n) if seeds else None)


def test_monte_carlo_mean_is_the_exact_elbo():
    exact = _exact_elbo()
    batch = _batch(4000)
    scores = elbo_scores(Scripted(batch, TABLE), batch, torch.Generator().manual_seed(0), num_mc=4, chunk_size=0)
    per_sample = scores.sequence_score().double()
    mean, se = per_sample.mean().item(), per_sample.std().item() / len(per_sample) ** 0.5
    assert abs(mean - exact) < 4 * se, (mean, exact, se)
    assert se < 0.05 * abs(exact)  # a test that can fail: the tolerance is a few percent of the value
    t = scores.info["t"]  # stratified: draw d of every canvas lies in [d / D, (d + 1) / D)
    assert ((t >= torch.arange(4)[None, :, None] / 4) & (t < (torch.arange(4)[None, :, None] + 1) / 4)).all()


def test_chunking_does_not_change_the_terms():
    batch = _batch(6, seeds=True)
    a = elbo_scores(Scripted(batch, TABLE), batch, torch.Generator().manual_seed(1), num_mc=2, chunk_size=0)
    b = elbo_scores(Scripted(batch, TABLE), batch, torch.Generator().manual_seed(1), num_mc=2, chunk_size=5)
    assert torch.equal(a.logp, b.logp)


# ---- the estimator on a tiny DiffusionGemma -------------------------------------------------------------------------
CANVAS = 4


@pytest.fixture(scope="module")
def gemma():
    cfg = tiny_config("diffusion_gemma", vocab_size=96, hidden_size=32, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, block_size=CANVAS)
    return build_model("diffusion_gemma", cfg, seed=0)


def _rollout_batch(dlm) -> ScoringBatch:
    prompt = torch.randint(3, 90, (2, 5), generator=torch.Generator().manual_seed(0))
    ro = sample_uniform(dlm, prompt, UniformDecodeConfig(max_new_tokens=2 * CANVAS, max_denoising_steps=3),
                        generator=torch.Generator().manual_seed(1))
    comp = ro.completion_ids[:, :7]  # two canvases, the second one filled up with pad
    counted = torch.ones_like(comp, dtype=torch.bool)
    counted[1, 5:] = False
    return ScoringBatch(prompt, torch.ones_like(prompt, dtype=torch.bool), comp, counted)


def test_tiny_model_is_finite_differentiable_and_common_random_numbers_repeat(gemma):
    batch = _rollout_batch(gemma)
    gemma.zero_grad()
    scores = estimate(gemma, "uniform_elbo", batch, torch.Generator().manual_seed(3), num_mc=2,
                      logprob_chunk_size=3)
    seq = scores.sequence_score()
    assert scores.logp.shape == (2, 2, 7) and torch.isfinite(seq).all() and (seq < 0).all()
    assert torch.equal(scores.weight[:, 1, 5:], torch.zeros(2, 2)) and (scores.weight[:, 0] == 1).all()
    assert scores.forwards == 2 * 2 * 2  # rows x draws x canvases
    seq.sum().backward()
    grad = gemma.hf_model.model.decoder.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    with torch.no_grad():
        again = estimate(gemma, "uniform_elbo", batch, torch.Generator().manual_seed(3), num_mc=2)
        other = estimate(gemma, "uniform_elbo", batch, torch.Generator().manual_seed(4), num_mc=2)
    assert torch.allclose(again.sequence_score(), seq.detach(), rtol=1e-5)  # chunked or not, same draws
    assert not torch.allclose(other.sequence_score(), seq.detach())


def test_a_canvas_is_scored_against_the_clean_canvases_before_it(gemma):
    """Teacher forcing: the first canvas's terms do not depend on the second canvas; the second's do depend on the
    first (it is in the encoder cache)."""
    batch = _rollout_batch(gemma)
    changed = batch.completion_ids.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % 90 + 3
    other = ScoringBatch(batch.prompt_ids, batch.prompt_mask, changed, batch.completion_mask)
    with torch.no_grad():
        a = estimate(gemma, "uniform_elbo", batch, torch.Generator().manual_seed(5), num_mc=1)
        b = estimate(gemma, "uniform_elbo", other, torch.Generator().manual_seed(5), num_mc=1)
        first = batch.completion_ids.clone()
        first[:, :4] = (first[:, :4] + 7) % 90 + 3
        c = estimate(gemma, "uniform_elbo", ScoringBatch(batch.prompt_ids, batch.prompt_mask, first,
                                                          batch.completion_mask), torch.Generator().manual_seed(5),
                     num_mc=1)
    assert torch.equal(a.logp[..., :4], b.logp[..., :4])
    assert not torch.allclose(a.logp[..., 4:], c.logp[..., 4:])


def test_estimators_refuse_the_other_noise_kind(gemma):
    batch = _rollout_batch(gemma)
    with pytest.raises(UserError) as err:
        estimate(gemma, "elbo", batch, torch.Generator().manual_seed(0))
    assert str(err.value) == ("estimator 'elbo' scores masked diffusion; diffusion_gemma is uniform-state: use "
                              "'trajectory' or 'uniform_denoise' or 'uniform_elbo'")
    with pytest.raises(UserError, match="estimator 'trace' scores masked diffusion; diffusion_gemma"):
        estimator_forwards(gemma, "trace", batch)
    llada = build_model("llada", tiny_config("llada", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                                             num_kv_heads=2, intermediate_size=32), seed=0)
    with pytest.raises(UserError) as err:
        estimate(llada, "uniform_elbo", batch, torch.Generator().manual_seed(0))
    assert str(err.value).startswith("estimator 'uniform_elbo' scores uniform-state diffusion; llada is masked: "
                                     "use 'ar' or 'block' or ")
    assert estimator_options("uniform_elbo") == ["num_mc", "logprob_chunk_size"]
