"""CJ-GRPO's transitions from the trace estimator: each transition's log-likelihood against per-step forwards
built by hand from the step map, the transition ids the loss groups by, and step_merge (one transition per
decoding block) on hand-built step maps."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, MASK, Spy, blockwise_logp, direct_logp, gen, tiny

from dllm_rl.estimators import ScoringBatch, estimate, plan_rows
from dllm_rl.sampling import DecodeConfig, generate

M = MASK
CJ = {"shrinkage": 1, "mask_uncounted": True}  # the cj_grpo preset's estimator options


def _full_batch() -> ScoringBatch:
    """P=3, G=6: answer of 5 tokens (the 5th EOS), one EOS padding token committed at step 4 (uncounted)."""
    comp = torch.tensor([[20, 21, 22, 23, EOS, EOS]])
    mask = torch.tensor([[True, True, True, True, True, False]])
    return ScoringBatch(torch.tensor([[10, 11, 12]]), torch.ones(1, 3, dtype=torch.bool), comp, mask,
                        torch.tensor([[0, 2, 1, 3, 3, 4]]))


def _by_transition(sc, ids: list[int]) -> list[torch.Tensor]:
    """The estimator's log-likelihood of each transition: the sum of its scored tokens' log-probs."""
    t = sc.info["transition"][0, 0]
    return [(sc.weight[0, 0] * sc.logp[0, 0])[t == i].sum() for i in ids]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_transition_loglik_equals_hand_built_per_step_forwards(models, family):
    model, batch = models[family], _full_batch()
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), **CJ)
    # the state before step k, by hand: the prompt, the tokens committed at steps < k, every other position masked
    # (the padding too, until its own step 4, as in the rollout)
    steps = batch.step_map[0].tolist()
    comp = batch.completion_ids[0].tolist()
    states = [[10, 11, 12] + [c if s < k else M for c, s in zip(comp, steps)] for k in range(4)]
    assert states == [[10, 11, 12, M, M, M, M, M, M], [10, 11, 12, 20, M, M, M, M, M],
                      [10, 11, 12, 20, M, 22, M, M, M], [10, 11, 12, 20, 21, 22, M, M, M]]
    assert torch.equal(spy.inputs(), torch.tensor(states))  # step 4 commits only padding: no transition scored
    assert sc.info["transition"][0, 0].tolist() == [0, 2, 1, 3, 3, 4]
    hand = direct_logp(model, torch.tensor(states), torch.ones(4, 9, dtype=torch.bool), 3,
                       batch.completion_ids.expand(4, -1))
    # transition k's log-likelihood: the sum over the counted tokens it committed, from state k's forward
    want = [hand[0, 0], hand[1, 2], hand[2, 1], hand[3, 3] + hand[3, 4]]
    for got, w in zip(_by_transition(sc, [0, 1, 2, 3]), want):
        torch.testing.assert_close(got, w, atol=1e-5, rtol=0)
    assert sc.weight[0, 0].tolist() == [1.0, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_rows_are_the_samplers_own_states(family):
    """A real rollout (cache off, so each step forwards the whole canvas): EOS is pushed from completion slot 6 on,
    so the answer ends in block 1, block 2 decodes to EOS only and the sampler stops, filling block 3 with EOS
    (step -1). The trace rows with the preset's options are exactly the canvases the sampler forwarded before each
    step that committed an answer token; TraceRL's default (padding as clean context) is not."""
    model, states = tiny(family), []

    def hook(module, args, kwargs, out):
        states.append(args[0].clone())
        out.logits[:, kwargs["logits_to_keep"] - 3 >= 6, EOS] += 30.0
        return out

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        r = generate(model, [[10, 11, 12]], DecodeConfig(gen_length=16, block_length=4, steps=3, cache="none", seed=0))
    finally:
        handle.remove()
    assert r.completion_mask[0].tolist() == [True] * 7 + [False] * 9
    assert (r.step_map[0, :12] >= 0).all() and r.step_map[0, 12:].tolist() == [-1] * 4
    assert (r.completion_ids[0, 6:] == EOS).all() and len(states) == 9
    batch = ScoringBatch.from_rollout(r)
    steps = torch.unique(r.step_map[r.completion_mask]).tolist()
    assert steps == [0, 1, 2, 3, 4, 5]
    rows = plan_rows(model, "trace", batch, None, **CJ)
    assert torch.equal(rows.input_ids, torch.cat([states[k] for k in steps]))
    default = plan_rows(model, "trace", batch, None, shrinkage=1)
    assert not torch.equal(default.input_ids, rows.input_ids)


def test_mask_uncounted_masks_the_early_stop_fill_not_prefilled_tokens(models):
    """Token 1 was prefilled (step -1, counted) and token 3 too (step -1, after the answer's EOS, before the last
    committed token): both clean from the start. Token 4 was committed at step 2 after the answer; token 5 is the
    EOS fill after an early stop (step -1 after the last committed token): a mask in every state."""
    comp = torch.tensor([[20, 21, EOS, 30, 31, EOS]])
    mask = torch.tensor([[True, True, True, False, False, False]])
    batch = ScoringBatch(torch.tensor([[10, 11, 12]]), torch.ones(1, 3, dtype=torch.bool), comp, mask,
                         torch.tensor([[1, -1, 0, -1, 2, -1]]))
    rows = plan_rows(models["llada"], "trace", batch, None, **CJ)
    assert rows.input_ids.tolist() == [[10, 11, 12, M, 21, M, 30, M, M], [10, 11, 12, M, 21, EOS, 30, M, M]]
    rows = plan_rows(models["llada"], "trace", batch, None, shrinkage=1)  # TraceRL's default: clean context
    assert rows.input_ids.tolist() == [[10, 11, 12, M, 21, M, 30, 31, EOS], [10, 11, 12, M, 21, EOS, 30, 31, EOS]]


def test_block_model_transitions_are_block_and_local_step(models):
    """SDAR: P=4 (the completion starts a block), blocks of 4; block 1 takes steps 0-2, block 2 steps 3-4. The
    transitions are the 5 (block, local step) pairs, each scored from its block's state before that local step,
    with the clean earlier blocks in view (the block sampler's context)."""
    model = models["sdar"]
    prompt = torch.tensor([[10, 11, 12, 13]])
    comp = torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27]])
    steps = torch.tensor([[1, 0, 1, 2, 3, 4, 4, 3]])  # local steps [1, 0, 1, 2 | 0, 1, 1, 0]
    batch = ScoringBatch(prompt, torch.ones(1, 4, dtype=torch.bool), comp, torch.ones(1, 8, dtype=torch.bool), steps)
    sc = estimate(model, "trace", batch, gen(0), **CJ)
    assert sc.forwards == 3  # one two-stream forward per local step, every block at once
    # id = block * 3 + local step (blocks 1 and 2; local steps 0..2)
    assert sc.info["transition"][0, 0].tolist() == [4, 3, 4, 5, 6, 7, 7, 6]
    local = torch.tensor([1, 0, 1, 2, 0, 1, 1, 0])
    valid = torch.ones(1, 12, dtype=torch.bool)
    want = {}
    for r in range(3):
        noisy = torch.cat([prompt, torch.where(local >= r, M, comp[0])[None]], dim=1)
        lp = blockwise_logp(model, noisy, valid, 4, comp)
        for blk in (0, 1):
            cols = (local == r) & (torch.arange(8) // 4 == blk)
            if cols.any():
                want[(blk + 1) * 3 + r] = lp[cols].sum()
    assert sorted(want) == [3, 4, 5, 6, 7]
    for got, (_, w) in zip(_by_transition(sc, sorted(want)), sorted(want.items())):
        torch.testing.assert_close(got, w, atol=1e-5, rtol=0)


def test_step_merge_full_attention_one_transition_per_block(models):
    """LLaDA, blocks of 4: block 0 took 2 steps, block 1 three (no fixed shrinkage merges exactly these: step // 2
    splits block 1 in two). step_merge scores each block from the state at its start."""
    model = models["llada"]
    comp = torch.tensor([[20, 21, 22, 23, 24, 25, EOS, EOS]])
    mask = torch.tensor([[True] * 7 + [False]])
    steps = torch.tensor([[0, 1, 0, 1, 2, 3, 4, 4]])
    batch = ScoringBatch(torch.tensor([[10, 11]]), torch.ones(1, 2, dtype=torch.bool), comp, mask, steps)
    with Spy(model) as spy:
        sc = estimate(model, "trace", batch, gen(0), step_merge=True, block_length=4, mask_uncounted=True)
    want = torch.tensor([[10, 11, M, M, M, M, M, M, M, M],
                         [10, 11, 20, 21, 22, 23, M, M, M, M]])
    assert torch.equal(spy.inputs(), want)
    assert sc.info["transition"][0, 0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sc.weight[0, 0].tolist() == [1.0] * 7 + [0.0]
    hand = direct_logp(model, want, torch.ones(2, 10, dtype=torch.bool), 2, comp.expand(2, -1))
    torch.testing.assert_close(sc.logp[0, 0, :7], torch.cat([hand[0, :4], hand[1, 4:7]]), atol=1e-5, rtol=0)
    # shrinkage 2 cuts block 1 at step 4: three transitions, not two
    assert estimate(model, "trace", batch, gen(0), shrinkage=2).forwards == 3
    # without mask_uncounted the padding stays clean context, as in every other trace row
    with Spy(model) as spy:
        estimate(model, "trace", batch, gen(0), step_merge=True, block_length=4)
    assert spy.inputs()[:, -1].tolist() == [EOS, EOS]


def test_step_merge_block_model_is_one_forward_from_all_masked_blocks(models):
    model = models["sdar"]
    prompt = torch.tensor([[10, 11, 12, 13]])
    comp = torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27]])
    steps = torch.tensor([[1, 0, 1, 2, 3, 4, 4, 3]])
    batch = ScoringBatch(prompt, torch.ones(1, 4, dtype=torch.bool), comp, torch.ones(1, 8, dtype=torch.bool), steps)
    sc = estimate(model, "trace", batch, gen(0), step_merge=True)
    assert sc.forwards == 1
    assert sc.info["transition"][0, 0].tolist() == [1] * 4 + [2] * 4
    noisy = torch.cat([prompt, torch.full((1, 8), M)], dim=1)
    want = blockwise_logp(model, noisy, torch.ones(1, 12, dtype=torch.bool), 4, comp)
    torch.testing.assert_close(sc.logp[0, 0], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("family", "options", "message"), [
    ("llada", {"step_merge": True, "shrinkage": 2}, "shrinkage must be 1 with it, got 2"),
    ("llada", {"step_merge": True}, "step_merge on a full-attention model needs block_length"),
    ("llada", {"block_length": 4}, "block_length is the semi-autoregressive block that step_merge merges"),
    ("sdar", {"step_merge": True, "block_length": 4}, "block models merge their layout block"),
    ("llada", {"step_merge": True, "block_length": 0}, "block_length must be an integer >= 1, got 0"),
    ("llada", {"step_merge": "yes", "block_length": 4}, "step_merge must be true or false, got 'yes'"),
])
def test_step_merge_option_errors(models, family, options, message):
    with pytest.raises(ValueError, match=message):
        estimate(models[family], "trace", _full_batch(), gen(0), **options)
