"""Registry, errors, common random numbers, gradients, every family x estimator, batching options."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import FAMILIES, MASK, Spy, gen, make_batch

from dllm_rl.estimators import (
    ESTIMATORS,
    ScoringBatch,
    estimate,
    estimator_forwards,
    estimator_options,
    plan_elbo,
    register,
)
from dllm_rl.models import block_causal_bias, position_ids_from_valid

NAMES = ("trace", "elbo", "mean_field", "random_mask", "coupled")


def test_registry_names():
    assert set(NAMES) <= set(ESTIMATORS)
    assert "shrinkage" in estimator_options("trace")
    assert {"num_mc", "coupled", "max_rows"} <= set(estimator_options("elbo"))


def test_unknown_name_and_option(models, batch):
    with pytest.raises(ValueError, match="valid estimators: .*coupled.*elbo.*mean_field.*random_mask.*trace"):
        estimate(models["llada"], "bogus", batch, gen(0))
    with pytest.raises(ValueError, match="unknown option.*num_samples.*valid options: num_mc"):
        estimate(models["llada"], "elbo", batch, gen(0), num_samples=3)
    with pytest.raises(ValueError, match="num_mc"):
        estimate(models["llada"], "elbo", batch, gen(0), num_mc=0)
    with pytest.raises(ValueError, match="lo must be <= hi"):
        estimate(models["llada"], "random_mask", batch, gen(0), lo=0.9, hi=0.1)
    with pytest.raises(ValueError, match="p_mask_prompt"):
        estimate(models["llada"], "mean_field", batch, gen(0), p_mask_prompt=1.5)
    with pytest.raises(ValueError, match="torch.Generator"):
        estimate(models["llada"], "elbo", batch, 0)
    with pytest.raises(ValueError, match="max_rows"):
        estimate(models["llada"], "elbo", batch, gen(0), max_rows=0)


def test_batch_validation():
    b = make_batch()
    with pytest.raises(ValueError, match="completion_mask has shape"):
        ScoringBatch(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask[:, :3])
    with pytest.raises(ValueError, match="step_map has shape"):
        ScoringBatch(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, b.step_map[:2])
    rollout = SimpleNamespace(prompt_ids=b.prompt_ids, prompt_mask=b.prompt_mask.long(),
                              completion_ids=b.completion_ids, completion_mask=b.completion_mask.long(),
                              step_map=b.step_map, nfe=torch.ones(3))
    got = ScoringBatch.from_rollout(rollout)
    assert got.prompt_mask.dtype == torch.bool and torch.equal(got.step_map, b.step_map)
    with pytest.raises(ValueError, match="lacks completion_mask"):
        ScoringBatch.from_rollout(SimpleNamespace(prompt_ids=1, prompt_mask=1, completion_ids=1))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", NAMES)
def test_every_family_and_estimator(models, batch, family, name):
    """Same seed -> identical scores; other seed -> other masks; global RNG untouched; gradients flow."""
    model = models[family]
    state = torch.get_rng_state()
    a = estimate(model, name, batch, gen(3))
    b = estimate(model, name, batch, gen(3))
    assert torch.equal(torch.get_rng_state(), state), "the global RNG must not be used"
    assert torch.equal(a.logp, b.logp) and torch.equal(a.weight, b.weight)
    d = a.num_draws
    assert a.logp.shape == a.weight.shape == (d, 3, 8) and a.logp.dtype == torch.float32
    assert torch.all(a.weight[:, ~batch.completion_mask] == 0), "uncounted tokens are never scored"
    assert torch.all(a.logp[a.weight == 0] == 0) and torch.all(a.logp[a.weight != 0] < 0)
    assert a.forwards == estimator_forwards(model, name, batch, gen(3))
    if name != "trace":  # trace is deterministic
        with Spy(model) as s1:
            estimate(model, name, batch, gen(3))
        with Spy(model) as s2:
            estimate(model, name, batch, gen(4))
        x, y = s1.inputs(), s2.inputs()
        assert x.shape != y.shape or not torch.equal(x == MASK, y == MASK)
    # gradients reach the parameters through logp
    model.zero_grad()
    loss = -estimate(model, name, batch, gen(3)).sequence_score().sum()
    loss.backward()
    for p in (model.model.get_input_embeddings().weight, model.model.lm_head.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    model.zero_grad()


@pytest.mark.parametrize("name", NAMES)
def test_max_rows_chunks_without_changing_scores(models, batch, name):
    model = models["sdar"]
    full = estimate(model, name, batch, gen(2))
    chunked = estimate(model, name, batch, gen(2), max_rows=2)
    torch.testing.assert_close(chunked.logp, full.logp, atol=1e-5, rtol=0)
    assert torch.equal(chunked.weight, full.weight)
    assert full.calls == 1 and chunked.calls == -(-full.forwards // 2)


@pytest.mark.parametrize("name", ["elbo", "mean_field", "random_mask", "coupled"])
def test_sample_seeds_make_masks_independent_of_the_batch(models, name):
    """With per-sample seeds a sample gets the same masks whatever micro-batch it is scored in."""
    model = models["llada"]
    batch = make_batch()
    batch.sample_seeds = torch.tensor([11, 22, 33])
    whole = estimate(model, name, batch, gen(9))
    for part in ([0, 2], [1]):
        sub = estimate(model, name, batch.select(part), gen(9))
        torch.testing.assert_close(sub.logp, whole.logp[:, part], atol=1e-5, rtol=0)
        assert torch.equal(sub.weight, whole.weight[:, part])


@pytest.mark.parametrize("family", ["llada", "sdar"])
@pytest.mark.parametrize("name", ["trace", "mean_field"])  # the others draw [B, D, G] numbers: G must match
def test_completion_valid_hides_right_padding(models, name, family):
    """Right-padding columns marked invalid change nothing: same scores as the batch without them."""
    model = models[family]
    short = make_batch()
    short.completion_mask[:, 6:] = False  # answers end within the first 6 columns
    base = ScoringBatch(short.prompt_ids, short.prompt_mask, short.completion_ids[:, :6],
                        short.completion_mask[:, :6], short.step_map[:, :6])
    padded_ids = torch.cat([base.completion_ids, torch.full((3, 3), 5)], 1)
    valid = torch.cat([torch.ones(3, 6, dtype=torch.bool), torch.zeros(3, 3, dtype=torch.bool)], 1)
    padded = ScoringBatch(base.prompt_ids, base.prompt_mask, padded_ids,
                          torch.cat([base.completion_mask, torch.zeros(3, 3, dtype=torch.bool)], 1),
                          torch.cat([base.step_map, torch.full((3, 3), -1)], 1), completion_valid=valid)
    a = estimate(model, name, base, gen(1))
    b = estimate(model, name, padded, gen(1))
    torch.testing.assert_close(b.logp[..., :6], a.logp, atol=1e-5, rtol=0)
    assert torch.all(b.weight[..., 6:] == 0)


def test_mask_uncounted_masks_the_padding(models, batch):
    model = models["llada"]
    with Spy(model) as spy:
        estimate(model, "mean_field", batch, gen(0), mask_uncounted=True, p_mask_prompt=0.0)
    comp = spy.inputs()[:, batch.prompt_len :]
    assert torch.all(comp == MASK)
    with Spy(model) as spy:
        estimate(model, "mean_field", batch, gen(0), p_mask_prompt=0.0)
    comp = spy.inputs()[:, batch.prompt_len :]
    assert torch.equal(comp == MASK, batch.completion_mask)


def test_register_refuses_a_second_planner_for_a_name():
    with pytest.raises(ValueError, match="estimator 'elbo' registered twice"):
        register("elbo")(lambda model, batch, generator: None)
    assert ESTIMATORS["elbo"] is plan_elbo


def test_options_are_the_planner_keywords_then_the_scorers():
    scorer = ["max_rows", "logprob_chunk_size"]
    assert estimator_options("block") == ["eps", "block_size", "mask_ratio", *scorer]
    assert estimator_options("ar") == scorer
    assert estimator_options("trace") == ["shrinkage", "layout", "mask_uncounted", "step_merge", "block_length",
                                          *scorer]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_ar_equals_a_full_causal_forward(models, batch, family):
    """``ar`` through the shared scorer (LM head on the kept columns only) gives the log-probs of one causal
    forward with full logits: token c from the raw logits at c - 1 (Dream: the adapter's aligned column c)."""
    model = models[family]
    with torch.no_grad():
        sc = estimate(model, "ar", batch, None, max_rows=2)
        ids, valid = batch.input_ids(), batch.valid()
        pos = position_ids_from_valid(valid)
        logits = model(input_ids=ids, position_ids=pos, attn_bias=block_causal_bias(valid, 1, pos)).logits
    p, g = batch.prompt_len, batch.completion_len
    cols = torch.arange(p, p + g) - (0 if model.family.shift else 1)
    want = torch.log_softmax(logits[:, cols].float(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    assert torch.equal(sc.weight[0], batch.completion_mask.float())
    torch.testing.assert_close(sc.logp[0][batch.completion_mask], want[batch.completion_mask], atol=1e-5, rtol=0)
    assert (sc.forwards, sc.calls) == (3, 2)


def test_ar_and_block_say_what_they_need(models, batch):
    with pytest.raises(ValueError, match="ar estimator is for full-attention models"):
        estimate(models["sdar"], "ar", batch, None)
    with pytest.raises(ValueError, match="block estimator on a full-attention model needs block_size"):
        estimate(models["llada"], "block", batch, gen(0))
    with pytest.raises(ValueError, match="block_size=2 but the batch is laid out at block 4"):
        estimate(models["sdar"], "block", batch, gen(0), block_size=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_agreed_calls_pad_with_one_token_forwards_that_change_nothing(models, batch, family):
    """``agree_calls`` (FSDP2 / ZeRO-3: the largest number of model calls over the ranks) makes ``score_rows``
    run that many calls: the extra ones are one-token forwards of the mask id, and neither the log-probs nor
    the gradients move. Asked with 2 rows per call, trace makes its own number of calls; agreed to 3 more."""
    model = models[family]
    asked: list[int] = []

    def agree(n: int) -> int:
        asked.append(n)
        return n + 3

    def scores(**extra):
        model.model.zero_grad(set_to_none=True)
        with Spy(model.model) as spy:
            out = estimate(model, "trace", batch, gen(0), max_rows=2, **extra)
        out.sequence_score().sum().backward()
        grads = [p.grad.clone() for p in model.model.parameters() if p.grad is not None]
        return out, spy.calls, grads

    plain, plain_calls, plain_grads = scores()
    padded, padded_calls, padded_grads = scores(agree_calls=agree)
    model.model.zero_grad(set_to_none=True)  # the models are shared by the session
    assert asked == [len(plain_calls)] and len(plain_calls) >= 2
    assert len(padded_calls) == len(plain_calls) + 3
    assert all(c["input_ids"].tolist() == [[MASK]] for c in padded_calls[len(plain_calls):])
    assert torch.equal(padded.logp, plain.logp) and torch.equal(padded.weight, plain.weight)
    assert len(padded_grads) == len(plain_grads)
    assert all(torch.equal(a, b) for a, b in zip(padded_grads, plain_grads))
