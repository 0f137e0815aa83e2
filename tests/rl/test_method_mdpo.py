"""MDPO (arXiv 2508.13148): step advantages, top-K steps, the hook's step rewards and training rows, the one_step
estimator's rows and the loss, on hand-computed cases."""

from __future__ import annotations

import pytest
import torch
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import ConfigError, load_config
from dllm_rl.estimators import ScoringBatch, TokenScores, plan_rows
from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.hooks import HookContext, RoundView, make_hook
from dllm_rl.rl.losses import POLICY_LOSSES, LossConfig, policy_objective
from dllm_rl.rl.methods.mdpo import step_advantages, step_scores, top_steps
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.sampling import Rollout

TOK = char_tokenizer()
MASK, EOS, PAD = TOK.mask_token_id, TOK.eos_token_id, TOK.pad_token_id


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_step_scores_and_advantages_of_the_worked_example():
    r = torch.tensor([[0, 1, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.float32)
    # d = r_t - r_{t-1} + 1; c = mean of the strictly later rewards, the last step its own reward
    assert step_scores(r).tolist() == [[2, 3, 2], [1.5, 2, 3], [2.5, 1, 0], [1, 1, 1]]
    adv = step_advantages(r, 4)
    want = [[0.387298, 1.305581, 0.387298], [-0.387298, 0.261116, 1.161894],
            [1.161893, -0.783349, -1.161894], [-1.161893, -0.783349, -0.387298]]
    assert adv.flatten().tolist() == pytest.approx(sum(want, []), abs=2e-6)
    assert top_steps(adv, 1, torch.ones(4, 3, dtype=torch.bool)).tolist() == [1]  # sum |A| = 3.0984, 3.1334, 3.0984
    # two groups of two are normalised apart: (2, 1.5) -> +-0.7071 at step 0; group 2 at step 2: (0, 1) -> -+0.7071
    two = step_advantages(r, 2)
    assert two[:, 0].tolist() == pytest.approx([0.707106, -0.707106, 0.707106, -0.707106], abs=2e-6)
    assert two[:, 2].tolist() == pytest.approx([-0.707106, 0.707106, -0.707106, 0.707106], abs=2e-6)
    assert torch.equal(step_advantages(r, 1), step_scores(r))  # a group of one: mean 0, std 1


def test_top_steps_sorted_and_only_where_a_sample_took_the_step():
    adv = torch.tensor([[0.1, -2.0, 0.5, 3.0], [0.2, 1.0, -0.5, 0.0]])
    everywhere = torch.ones(2, 4, dtype=torch.bool)
    assert top_steps(adv, 2, everywhere).tolist() == [1, 3]  # sum |A| = 0.3, 3.0, 1.0, 3.0: sorted, not by size
    assert top_steps(adv, 3, everywhere).tolist() == [1, 2, 3]
    valid = everywhere.clone()
    valid[:, 3] = False  # no sample took step 3
    assert top_steps(adv, 2, valid).tolist() == [1, 2]
    assert top_steps(adv, 9, valid).tolist() == [0, 1, 2]


def _round() -> RoundView:
    """One prompt, two samples of 3 slots. Sample 0 decodes a, x, c one per step: its step-0 prediction "a7b" holds a
    7 that step 1 replaces (backslide). Sample 1 decodes b at step 0, then "c7" at step 1 (2 steps)."""
    preds = [["a7b", "axb", "axc"], ["bbb", "c7b", "c7b"]]
    masked = [[[1, 1, 1], [0, 1, 1], [0, 0, 1]], [[1, 1, 1], [1, 1, 0], [0, 0, 0]]]
    conf = torch.tensor([[[0.9, 0.5, 0.4], [0, 0.6, 0.3], [0, 0, 0.8]], [[0.2, 0.3, 0.7], [0.5, 0.9, 0], [0, 0, 0]]])
    tokens = torch.tensor([[ids(p) for p in row] for row in preds], dtype=torch.int32)
    tokens[1, 2] = PAD  # sample 1 took no step 2
    rollout = Rollout(
        prompt_ids=torch.tensor([ids("5"), ids("5")]), prompt_mask=torch.ones(2, 1, dtype=torch.bool),
        completion_ids=torch.tensor([ids("axc"), ids("c7b")]), completion_mask=torch.ones(2, 3, dtype=torch.bool),
        step_map=torch.tensor([[0, 1, 2], [1, 1, 0]]), nfe=torch.tensor([3, 2]), finish_reason=["length"] * 2,
        texts=["axc", "c7b"], confidence=torch.tensor([[0.9, 0.6, 0.8], [0.5, 0.9, 0.7]]), pad_token_id=PAD,
        step_tokens=tokens, step_masked=torch.tensor(masked, dtype=torch.bool), step_confidence=conf)
    return RoundView([ids("5")] * 2, ["5"] * 2, rollout, [0.0, 1.0], ["", ""], [11, 12], {"answer": ["7", "7"]}, 2)


def test_the_hook_rewards_every_step_and_trains_the_top_steps_pairs():
    calls = []

    def reward(indices, rollout):  # the round's reward call: a 7 in the answer scores 1
        calls.append((indices, rollout.texts))
        return [float("7" in t) for t in rollout.texts], [""] * len(indices)

    ctx = HookContext(generate=None, reward=reward, reference=lambda i: None, tokenizer=TOK, eos_token_id=EOS,
                      gen_length=3, step=0)
    hook = make_hook("mdpo", {"train_steps": 2})
    assert hook.records_steps and hook.makes_training_rows
    out = hook(_round(), ctx)
    assert [c[0] for c in calls] == [[0, 1], [0, 1], [0]]  # sample 1 took 2 steps: its step 2 is its final answer
    assert [c[1] for c in calls] == [["a7b", "bbb"], ["axb", "c7b"], ["axc"]]
    # r = [[1, 0, 0], [0, 1, 1]] -> s = [[2, 0, 1], [2, 3, 2]]: step 0 ties (A = 0), steps 1, 2 differ (A = -+0.7071);
    # sum |A| over the samples that took the step: [0, 1.4142, 0.7071] -> top 2 = steps 1, 2; pairs step-major, none
    # for sample 1 at step 2
    train = out.training
    assert train.source == [0, 1, 0]
    assert train.advantages.tolist() == pytest.approx([-0.707106, 0.707106, -0.707106], abs=2e-6)
    rows = train.rollout
    assert [TOK.decode(r) for r in rows.completion_ids.tolist()] == ["axb", "c7b", "axc"]
    assert rows.completion_mask.int().tolist() == [[0, 1, 1], [1, 1, 0], [0, 0, 1]]  # the slots masked before
    assert rows.confidence.flatten().tolist() == pytest.approx([0, 0.6, 0.3, 0.5, 0.9, 0, 0, 0, 0.8])
    assert rows.step_tokens is None and out.rollout.step_tokens is None  # the recorded steps are dropped
    assert out.rewards == [0.0, 1.0]  # the samples keep their outcome rewards
    assert out.stats == {"mdpo_step_reward": pytest.approx(2 / 5), "mdpo_backslide": 1.0, "mdpo_pairs": 3.0}


def _scores(logp, weight, conf) -> TokenScores:
    return TokenScores(torch.tensor(logp)[None], torch.tensor(weight)[None], forwards=1,
                       info={"confidence": torch.tensor(conf)[None]})


def test_mdpo_loss_hand_computed():
    loss_fn = POLICY_LOSSES["mdpo"]
    weight = [[1.0, 1, 1, 1, 0, 0, 0, 0]]  # L = 8 columns, |M| = 4: lambda = 2
    conf = [[0.9, 0.5, 0.2, 0.4, 0, 0, 0, 0]]
    cfg = LossConfig(aggregation="seq_mean", max_length=8)
    new = _scores([[-1.0] * 8], weight, conf)
    lengths = torch.tensor([4])
    assert float(loss_fn(new, new, None, torch.tensor([1.0]), lengths, cfg).loss) == pytest.approx(-1.0)
    assert float(loss_fn(new, new, None, torch.tensor([-0.5]), lengths, cfg).loss) == pytest.approx(0.5)
    # slot 0's ratio 1.5 is clipped at 1.2 for A = 1: (-1.2 * 2 * 0.9 - 2 * (0.5 + 0.2 + 0.4)) / 4
    moved = _scores([[-1.0 + torch.log(torch.tensor(1.5)).item()] + [-1.0] * 7], weight, conf)
    out = loss_fn(moved, new, None, torch.tensor([1.0]), lengths, cfg)
    assert float(out.loss) == pytest.approx(-1.09)
    assert out.stats["clip_frac"] == pytest.approx(0.25)
    # two rows: the second has |M| = 2 (lambda 4), conf (1, 0.5), A = -0.5: (0.5 * 4 * 1.5) / 2 = 1.5
    two = _scores([[-1.0] * 8, [-1.0] * 8], weight + [[0, 0, 1.0, 1, 0, 0, 0, 0]],
                  conf + [[0, 0, 1.0, 0.5, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5])
    assert float(loss_fn(two, two, None, adv, torch.tensor([4, 2]), cfg).loss) == pytest.approx((-1.0 + 1.5) / 2)
    token_mean = LossConfig(aggregation="token_mean", max_length=8)  # the authors' sum over a step / all masks
    assert float(loss_fn(two, two, None, adv, torch.tensor([4, 2]), token_mean).loss) == pytest.approx(-1 / 6)
    # k2 KL at beta 0.02 per scored token, not weighted: 0.5 * 0.2^2 on each of the 4 slots
    ref = _scores([[-1.2] * 8], weight, conf)
    kl = policy_objective(loss_fn, new, new, ref, torch.tensor([1.0]), lengths,
                          LossConfig(aggregation="seq_mean", max_length=8, beta=0.02, kl_estimator="k2"))
    assert kl.stats["kl"] == pytest.approx(0.02) and float(kl.loss) == pytest.approx(-1.0 + 0.02 * 0.02)
    with pytest.raises(ValueError, match="sampling confidence"):
        loss_fn(TokenScores(new.logp, new.weight, forwards=1), new, None, torch.tensor([1.0]), lengths, cfg)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_one_step_rows_mask_exactly_the_predicted_slots(family):
    cfg = tiny_config(family, vocab_size=len(TOK), mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD,
                      hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1, num_layers=1, block_size=4)
    model = build_model(family, cfg, seed=0)
    comp = torch.tensor([ids("ab7c") + [MASK] * 4, ids("xyz1") + ids("2345")])
    scored = torch.tensor([[0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    conf = torch.tensor([[0, 0.8, 0.3, 0, 0, 0, 0, 0], [0.0] * 8])
    batch = ScoringBatch(torch.tensor([ids("9+"), ids("8*")]), torch.ones(2, 2, dtype=torch.bool), comp, scored,
                         confidence=conf)
    rows = plan_rows(model, "one_step", batch, None)
    assert rows.sample.tolist() == [0]  # sample 1 predicted nothing: no row
    want = ids("9+a") + [MASK, MASK] + ids("c") + [MASK] * 4  # later slots keep the state's mask ids
    assert rows.input_ids.tolist() == [want]
    assert rows.weight.tolist() == [[0, 1, 1, 0, 0, 0, 0, 0]]
    assert torch.equal(rows.info["confidence"], conf[None])
    assert (rows.clean_ids is not None) == (family == "sdar")  # block models: the two-stream layout


def test_mdpo_refuses_dynamic_sampling(rl_setup, tmp_path):
    over = rl_overrides(rl_setup, "llada", tmp_path / "run", "algorithm=mdpo", "dynamic_sampling=true")
    with pytest.raises(ConfigError, match="dynamic_sampling: rollout hook 'mdpo' trains on rows of its own"):
        RLTrainer(load_config(RLConfig, None, over), reward_fn=digit_reward)


def test_the_trainer_rewards_every_step_with_the_prompts_data(rl_setup, tmp_path):
    calls = []

    def reward(prompts, completions, **columns):  # digit_reward, recording what each call receives
        calls.append((len(completions), columns["target"], columns["nums"]))
        return digit_reward(prompts, completions)

    over = rl_overrides(rl_setup, "llada", tmp_path / "run", "algorithm=mdpo", "train.prompts_per_step=1",
                        "rollout.gen_length=4", "rollout.block_length=4", "rollout.cache=none")
    trainer = RLTrainer(load_config(RLConfig, None, over), reward_fn=reward)
    try:
        metrics = trainer.step().metrics
    finally:
        trainer.close()
    # 4 samples of one prompt, one token per step: the completions' call, then one call per step (4 steps)
    assert [n for n, _, _ in calls] == [4] * 5
    assert all(target == calls[0][1] and nums == calls[0][2] and len(set(map(str, target))) == 1
               for _, target, nums in calls)  # every call carries the prompt's own data, once per sample
    assert metrics["mdpo_pairs"] == 16.0  # 4 samples x min(train_steps 16, 4 steps)
    assert metrics["ratio_dev_first_update"] == 0.0 and "loss" in metrics
