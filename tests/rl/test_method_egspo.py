"""EGSPO (arXiv 2603.12554, as its released code does it): the recorded entropy, the step selection on a hand-built
entropy trace, the step rows, and the step-level loss and KL by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.estimators import ESTIMATORS, ScoringBatch, TokenScores
from dllm_rl.estimators.egspo_steps import select_steps
from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.rl.hooks import HookContext, RoundView, make_hook
from dllm_rl.rl.losses import LossConfig, policy_objective
from dllm_rl.rl.methods import POLICY_LOSSES
from dllm_rl.rl.methods.egspo import stepwise_advantages, token_advantages
from dllm_rl.sampling import DecodeConfig, Rollout, generate
from dllm_rl.sampling.confidence import entropies

VOCAB, MASK = 32, 31


def tiny(family: str):
    cfg = tiny_config(family, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, block_size=4)
    return build_model(family, cfg, seed=0)


def test_entropy_of_the_facts_example_and_of_random_logits():
    inf = float("inf")
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [5.0, -inf, -inf, -inf]]], dtype=torch.float64)
    h = entropies(logits)[0]
    assert h.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-12)
    assert h.mean().item() == pytest.approx(0.693147, abs=1e-6)  # the step's score
    x = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4
    p = torch.softmax(x, -1)
    assert torch.allclose(entropies(x), -(p * torch.log(p)).sum(-1), atol=1e-12)


# one sample, 8 counted tokens then 2 EOS padding (uncounted), 2 tokens per step over steps 0..4:
#   step:     0    0    1    1    2    2    3    3    4    4
#   entropy: 0.2  0.4  1.0  0.0  .75  .25  0.1  0.3  9.0  9.0   (step 4 holds the uncounted padding only)
STEP = torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [1, 0, 2, -1, -1, -1, -1, -1, -1, -1]])
ENTROPY = torch.tensor([[0.2, 0.4, 1.0, 0.0, 0.75, 0.25, 0.1, 0.3, 9.0, 9.0], [0.5, 0.7, 0.0] + [0.0] * 7])
COUNTED = torch.tensor([[True] * 8 + [False] * 2, [True] * 3 + [False] * 7])


def test_top_k_steps_by_the_mean_entropy_of_the_committed_counted_tokens():
    # sample 0: step means 0.3, 0.5, 0.5 (exactly), 0.2 (step 4 is padding): top 3 = 1 and 2 (a tie: the earlier
    # first), 0;
    # sample 1: steps 0 (0.7), 1 (0.5), 2 (0.0) and nothing more
    steps, scores = select_steps(STEP, ENTROPY, COUNTED, 3)
    assert steps.tolist() == [[1, 2, 0], [0, 1, 2]]
    assert scores.flatten().tolist() == pytest.approx([0.5, 0.5, 0.3, 0.7, 0.5, 0.0])
    steps, scores = select_steps(STEP, ENTROPY, COUNTED, 5)
    assert steps.tolist() == [[1, 2, 0, 3, -1], [0, 1, 2, -1, -1]]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_each_draw_is_the_state_before_its_step_scoring_that_step(family):
    g = torch.Generator().manual_seed(0)
    batch = ScoringBatch(torch.randint(0, 28, (2, 2), generator=g), torch.ones(2, 2, dtype=torch.bool),
                         torch.randint(0, 28, (2, 10), generator=g), COUNTED, step_map=STEP, entropy=ENTROPY)
    rows = ESTIMATORS["egspo_steps"](tiny(family), batch, None, num_steps=2)
    assert rows.num_draws == 2 and rows.clean_ids is None  # single-stream rows on both kinds of model
    want = {(0, 0): 1, (1, 0): 2, (0, 1): 0, (1, 1): 1}  # (draw, sample) -> the selected step
    assert sorted(zip(rows.draw.tolist(), rows.sample.tolist())) == sorted(want)
    for r in range(rows.num_rows):
        d, b = int(rows.draw[r]), int(rows.sample[r])
        t = want[(d, b)]
        masked = (rows.input_ids[r, 2:] == MASK).tolist()
        assert masked == [bool(COUNTED[b, i]) and int(STEP[b, i]) >= t for i in range(10)]
        assert rows.weight[r].tolist() == [float(bool(COUNTED[b, i]) and int(STEP[b, i]) == t) for i in range(10)]
    assert rows.info["step"].tolist() == [[1.0, 0.0], [2.0, 1.0]]


def test_without_the_rollout_entropy_the_estimator_says_what_it_needs():
    batch = ScoringBatch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                         torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                         step_map=torch.arange(3)[None])
    with pytest.raises(ValueError, match="egspo_steps estimator needs batch.step_map and batch.entropy"):
        ESTIMATORS["egspo_steps"](tiny("llada"), batch, None)


def test_the_step_loss_by_hand():
    # the facts' example: A = 2/3, step log-prob new -1.0 (two tokens), old -1.5: r = e^0.5 clipped to 1.5 -> -1.0,
    # over 2 tokens per step -> -0.5; a second draw scores nothing and does not count
    new = TokenScores(torch.tensor([[[-0.4, -0.6]], [[0.0, 0.0]]], requires_grad=True),
                      torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]]), 0)
    old = TokenScores(torch.tensor([[[-0.5, -1.0]], [[0.0, 0.0]]]), new.weight, 0)
    cfg = LossConfig(epsilon=0.2, epsilon_high=0.5, options={"tokens_per_step": 2})
    out = POLICY_LOSSES["egspo"](new, old, None, torch.tensor([2 / 3]), torch.tensor([2]), cfg)
    assert out.loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert out.stats["clip_frac"] == 1.0
    # unclipped (A < 0): -(-2/3) e^0.5 / 2, gradient e^0.5 / 3 on each of the step's tokens
    out = POLICY_LOSSES["egspo"](new, old, None, torch.tensor([-2 / 3]), torch.tensor([2]), cfg)
    assert out.loss.item() == pytest.approx(math.exp(0.5) / 3, abs=1e-6)
    out.loss.backward()
    assert new.logp.grad[0, 0].tolist() == pytest.approx([math.exp(0.5) / 3] * 2, abs=1e-6)


def test_the_step_level_kl_by_hand():
    # k3 on the step log-likelihoods: d = ref - new = -2.0 - (-1.0) = -1 -> e^-1 + 1 - 1; one live cell of two
    new = TokenScores(torch.tensor([[[-0.4, -0.6]], [[0.0, 0.0]]]), torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]]), 0)
    ref = TokenScores(torch.tensor([[[-1.5, -0.5]], [[0.0, 0.0]]]), new.weight, 0)
    cfg = LossConfig(beta=0.1, kl_estimator="k3", options={"tokens_per_step": 2})
    out = policy_objective(POLICY_LOSSES["egspo"], new, new, ref, torch.tensor([1.0]), torch.tensor([2]), cfg)
    assert out.stats["kl"] == pytest.approx(math.exp(-1.0), abs=1e-6)
    assert out.loss.item() == pytest.approx(-1.0 / 2 + 0.1 * math.exp(-1.0), abs=1e-6)


def test_the_rollout_records_the_entropy_the_model_had_at_each_commit():
    model = tiny("llada")
    with torch.no_grad():
        model.model.lm_head.weight.mul_(4.0)  # spread the entropies
    prompt = [3, 4, 5]
    roll = generate(model, [prompt], DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, seed=3,
                                                  cache="none"))
    ids, step = roll.completion_ids[0], roll.step_map[0]
    assert (step >= 0).all()
    for t in range(int(step.max()) + 1):  # replay the state before step t: later tokens masked
        state = torch.where(step >= t, torch.full_like(ids, MASK), ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + state.tolist()])).logits[0, 3:].double()
        at = step == t
        assert torch.allclose(roll.entropy[0][at].double(), entropies(logits)[at], atol=1e-5)
    assert len(set(roll.entropy[0].tolist())) > 4
    moved = type(roll).cat([roll, roll.select([0])]).to("cpu")
    assert torch.equal(moved.entropy, torch.cat([roll.entropy, roll.entropy]))


def test_stepwise_advantages_by_hand():
    # one group of 2, K = 2; R = (1, 0); one-step rewards R_k: sample 0 (0, 1), sample 1 (0, 0); lambda 0.5:
    # G = (R + 0.5 (R - R_k)) / 1.5 -> sample 0 (1.0, 2/3), sample 1 (0, 0); column means (0.5, 1/3)
    final, step_r = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    every = torch.ones(2, 2, dtype=torch.bool)
    adv = stepwise_advantages(final, step_r, every, 2, 0.5)
    assert adv.flatten().tolist() == pytest.approx([0.5, 1 / 3, -0.5, -1 / 3], abs=1e-6)
    # not normalised: G = R + 0.5 (R - R_k) -> (1.5, 1.0), (0, 0)
    raw = stepwise_advantages(final, step_r, every, 2, 0.5, normalize=False)
    assert raw.flatten().tolist() == pytest.approx([0.75, 0.5, -0.75, -0.5], abs=1e-6)
    # lambda 0: the final reward minus the group mean, in every column
    assert stepwise_advantages(final, step_r, every, 2, 0.0).flatten().tolist() == [0.5, 0.5, -0.5, -0.5]
    # sample 1 has no second step: column 1's mean is sample 0's alone (A = 0), sample 1's cell 0
    part = torch.tensor([[True, True], [True, False]])
    assert stepwise_advantages(final, step_r, part, 2, 0.5).flatten().tolist() == pytest.approx(
        [0.5, 0.0, -0.5, 0.0], abs=1e-6)
    # two groups are centred apart
    four = stepwise_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.zeros(4, 1), torch.ones(4, 1, dtype=bool),
                               2, 0.5)
    assert four.flatten().tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


def test_token_advantages_give_each_token_its_selected_steps_value():
    steps = torch.tensor([[1, 2], [0, -1]])
    adv = torch.tensor([[0.5, -1.0], [2.0, 7.0]])
    tok = token_advantages(STEP[:, :6], steps, adv)
    assert tok.tolist() == [[0.0, 0.0, 0.5, 0.5, -1.0, -1.0], [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]]


def _greedy_round() -> tuple[RoundView, list[list[str]]]:
    """One prompt, two samples of 3 slots decoded in 3 and 2 steps, with their greedy step predictions; the
    entropies make sample 0's steps rank 2, 0, 1 and sample 1's 1, 0."""
    tok = char_tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    preds = [["a7b", "axb", "axc"], ["bbb", "c7b", "c7b"]]
    tokens = torch.tensor([[enc(p) for p in row] for row in preds], dtype=torch.int32)
    tokens[1, 2] = tok.pad_token_id
    masked = torch.tensor([[[1, 1, 1], [0, 1, 1], [0, 0, 1]], [[1, 1, 1], [1, 1, 0], [0, 0, 0]]], dtype=torch.bool)
    rollout = Rollout(
        prompt_ids=torch.tensor([enc("5"), enc("5")]), prompt_mask=torch.ones(2, 1, dtype=torch.bool),
        completion_ids=torch.tensor([enc("axc"), enc("c7b")]), completion_mask=torch.ones(2, 3, dtype=torch.bool),
        step_map=torch.tensor([[0, 1, 2], [1, 1, 0]]), nfe=torch.tensor([3, 2]), finish_reason=["length"] * 2,
        texts=["axc", "c7b"], pad_token_id=tok.pad_token_id, entropy=torch.tensor([[0.5, 0.1, 0.9], [0.4, 0.2, 0.1]]),
        step_tokens=tokens, step_masked=masked, step_confidence=torch.zeros(2, 3, 3))
    view = RoundView([enc("5")] * 2, ["5"] * 2, rollout, [0.0, 1.0], ["", ""], [11, 12], {}, 2)
    return view, tok


def test_the_hook_rewards_the_selected_steps_greedy_completions_in_one_call():
    view, tok = _greedy_round()
    calls = []

    def reward(indices, rollout):  # a 7 in the answer scores 1
        calls.append((indices, rollout.texts, rollout.step_map.tolist()))
        return [float("7" in t) for t in rollout.texts], [""] * len(indices)

    ctx = HookContext(generate=None, reward=reward, reference=lambda i: None, tokenizer=tok,
                      eos_token_id=tok.eos_token_id, gen_length=3, step=0, mask_token_id=tok.mask_token_id)
    hook = make_hook("egspo_returns", {"lam": 0.5, "num_steps": 2})
    assert hook.records_steps == "greedy"
    out = hook(view, ctx)
    # K = 2: sample 0's steps by entropy: 2 (0.9), 0 (0.5); sample 1's: 1 (mean of slots 0, 1: 0.3), 0 (0.1); the
    # four greedy completions in one reward call, row-major
    assert len(calls) == 1
    assert calls[0][0] == [0, 0, 1, 1]
    assert calls[0][1] == ["axc", "a7b", "c7b", "bbb"]
    assert calls[0][2][1] == [0, 0, 0] and calls[0][2][2] == [1, 1, 0]  # the predicted slots carry their step
    # R = (0, 1); R_k: sample 0 (0, 1), sample 1 (1, 0). G = (R + 0.5 (R - R_k)) / 1.5: sample 0 (0, -1/3),
    # sample 1 (2/3, 1); column means (1/3, 1/3): A = sample 0 (-1/3, -2/3), sample 1 (1/3, 2/3); each token gets
    # its step's (sample 0's step 1 was not selected: 0)
    assert out.advantages.flatten().tolist() == pytest.approx([-2 / 3, 0.0, -1 / 3, 1 / 3, 1 / 3, 2 / 3], abs=1e-6)
    assert out.rewards == [0.0, 1.0] and out.rollout.step_tokens is None
    assert out.stats == {"egspo_step_reward": pytest.approx(0.5)}


def test_the_loss_reads_each_cells_step_advantage_from_token_advantages():
    # two draws x one sample: draw 0 scores tokens 0, 1 (A = -0.5), draw 1 token 2 (A = 1.0); as [B] advantages
    # the cells would share one; per token each cell takes its own
    new = TokenScores(torch.tensor([[[-0.4, -0.6, -1.0]], [[-0.4, -0.6, -1.0]]], requires_grad=True),
                      torch.tensor([[[1.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]]), 0)
    cfg = LossConfig(epsilon=0.2, epsilon_high=0.5, options={"tokens_per_step": 1})
    tok_adv = torch.tensor([[-0.5, -0.5, 1.0]])
    out = POLICY_LOSSES["egspo"](new, new, None, tok_adv, torch.tensor([3]), cfg)
    assert out.loss.item() == pytest.approx((0.5 - 1.0) / 2, abs=1e-6)
    out.loss.backward()  # d/dz of -r A at r = 1: -A / 2 cells, on each scored token
    assert new.logp.grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.0, 0.0, -0.5], abs=1e-6)


def test_greedy_step_records_are_the_argmax_of_the_logits_before_each_step():
    model = tiny("llada")
    with torch.no_grad():
        model.model.lm_head.weight.mul_(4.0)
    prompt = [3, 4, 5]
    cfg = DecodeConfig(gen_length=8, block_length=8, steps=4, temperature=1.0, seed=3, cache="none")
    roll = generate(model, [prompt], cfg, record_steps="greedy")
    sampled = generate(model, [prompt], cfg, record_steps="sampled")
    assert torch.equal(roll.completion_ids, sampled.completion_ids)  # recording changes nothing decoded
    ids, step = roll.completion_ids[0], roll.step_map[0]
    differs = 0
    for t in range(int(step.max()) + 1):
        state = torch.where(step >= t, torch.full_like(ids, MASK), ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + state.tolist()])).logits[0, 3:]
        todo = step >= t
        assert roll.step_masked[0, t].tolist() == todo.tolist()
        assert roll.step_tokens[0, t][todo].tolist() == logits.argmax(-1)[todo].tolist()
        assert roll.step_tokens[0, t][~todo].tolist() == ids[~todo].tolist()
        differs += int((sampled.step_tokens[0, t][todo] != roll.step_tokens[0, t][todo]).sum())
    assert differs > 0  # at temperature 1 the sampled predictions are not the argmax
    with pytest.raises(ValueError, match="record_steps must be one of sampled, greedy"):
        generate(model, [prompt], cfg, record_steps="best")


def test_the_hook_refuses_a_config_it_does_not_fit():
    from dllm_rl.config import ConfigError, load_config
    from dllm_rl.rl.algorithms import _fill_preset, check_combination
    from dllm_rl.rl.config import RLConfig

    base = ["algorithm=egspo", "model.path=x", "data.task=countdown"]
    cfg = load_config(RLConfig, None, base)
    check_combination(_fill_preset(cfg, "full"))  # the preset fits
    bad = load_config(RLConfig, None, [*base, 'estimator_options={"num_steps": 4}'])
    with pytest.raises(ConfigError, match=r"rollout_hook_options.num_steps: 8 must equal estimator_options.num_steps"):
        check_combination(_fill_preset(bad, "full"))
    other = load_config(RLConfig, None, [*base, "estimator=one_step"])
    with pytest.raises(ConfigError, match="egspo_returns gives the advantages of the egspo_steps estimator"):
        check_combination(_fill_preset(other, "full"))
    for extra, says in (("loss_type=token", "loss_type: egspo_returns gives one advantage per"),
                        ("dynamic_sampling=true", "dynamic_sampling: egspo_returns computes each round's")):
        with pytest.raises(ConfigError, match=says):
            check_combination(_fill_preset(load_config(RLConfig, None, [*base, extra]), "full"))


def test_rollout_hook_off_switches_the_presets_hook_off():
    """``rollout_hook=off`` (not null, which takes the preset's) runs EGSPO without its stepwise returns: no hook,
    the preset's options not filled in, the config still valid (the lambda = 0 advantage)."""
    from dllm_rl.config import ConfigError, load_config
    from dllm_rl.rl.algorithms import _fill_preset, check_combination
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.hooks import make_hook

    base = ["algorithm=egspo", "model.path=x", "data.task=countdown"]
    on = _fill_preset(load_config(RLConfig, None, base), "full")
    assert on.rollout_hook == "egspo_returns" and on.rollout_hook_options == {"lam": 0.5, "num_steps": 8}
    off = _fill_preset(load_config(RLConfig, None, [*base, "rollout_hook=off"]), "full")
    assert off.rollout_hook == "off" and off.rollout_hook_options is None and off.estimator == "egspo_steps"
    check_combination(off)
    assert make_hook(off.rollout_hook, off.rollout_hook_options) is None
    null = _fill_preset(load_config(RLConfig, None, [*base, "rollout_hook=null"]), "full")
    assert null.rollout_hook == "egspo_returns"  # null is "unset": the preset fills it
    with pytest.raises(ConfigError, match="rollout_hook_options: rollout_hook=off runs no hook, so it takes no"):
        check_combination(_fill_preset(load_config(RLConfig, None, [*base, "rollout_hook=off",
                                                                     'rollout_hook_options={"lam": 0}']), "full"))
