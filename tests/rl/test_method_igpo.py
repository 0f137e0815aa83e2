"""IGPO's entropy filter (dllm_rl.rl.inpaint_filter): the kept inpainted tokens on hand-built cases, the rollout's
record of inpainted tokens, and RL steps in which the hook inpaints: the filter's counts, and the policy's own
reward (``reward_policy``) beside the reward after the hook."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import countdown_root, rl_overrides

from dllm_rl.config import load_config
from dllm_rl.estimators import TokenScores
from dllm_rl.models import build_model, char_tokenizer, tiny_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.inpaint_filter import inpaint_loss_mask, top_entropy_keep
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.sampling import DecodeConfig, Rollout, generate


@pytest.fixture(scope="module")
def igpo_setup(tmp_path_factory):
    return countdown_root(tmp_path_factory.mktemp("igpo"), ("llada", "dream", "sdar"), 4, 1, hidden_size=16,
                          intermediate_size=32, num_heads=2, num_kv_heads=1, num_layers=1)


# the facts sheet's worked example: 10 inpainted tokens, k = max(1, floor(10 x 0.2)) = 2 -> idx 5 (3.0), 1 (2.3)
HINTS = [0.1, 2.3, 0.5, 1.7, 0.05, 3.0, 0.9, 0.2, 1.1, 0.4]


def test_the_top_fraction_of_each_rows_inpainted_tokens_by_entropy_trains():
    entropy = torch.zeros(3, 30)
    entropy[0, :10] = torch.tensor(HINTS)
    entropy[0, 10:] = 9.0  # generated tokens: high entropy, but never candidates
    entropy[1, [4, 9, 20]] = torch.tensor([0.3, 0.9, 0.1])
    candidates = torch.zeros(3, 30, dtype=torch.bool)
    candidates[0, :10] = True
    candidates[1, [4, 9, 20]] = True  # 3 candidates: floor(0.6) = 0 -> k = 1
    keep = top_entropy_keep(entropy, candidates, 0.2)
    assert torch.nonzero(~keep).tolist() == [[0, i] for i in (0, 2, 3, 4, 6, 7, 8, 9)] + [[1, 4], [1, 20]]
    assert keep.sum(-1).tolist() == [22, 28, 30]  # 20 generated + 2 hints; 27 + 1; a row without hints
    assert bool(top_entropy_keep(entropy, candidates, 1.0).all())


def test_the_entropy_is_the_mean_over_the_draws_that_scored_a_token():
    # 2 draws, 1 sample, 4 tokens, all inpainted: token 0 scored in draw 0 only (entropy 5), token 1 in both
    # (mean 2), token 2 in draw 1 only (4), token 3 in none (not a candidate, so it trains)
    logp = torch.tensor([[[5.0, 1.0, 0.0, 0.0]], [[0.0, 3.0, 4.0, 0.0]]])
    weight = torch.tensor([[[1.0, 1.0, 0.0, 0.0]], [[0.0, 1.0, 1.0, 0.0]]])
    scores = TokenScores(logp=logp, weight=weight, forwards=2)
    keep, n, k = inpaint_loss_mask(scores, torch.ones(1, 4, dtype=torch.bool), 0.5)  # 3 candidates: k = 1
    assert keep.tolist() == [[True, False, False, True]] and (n, k) == (3, 1)


def test_rollouts_mark_their_prefilled_tokens_through_select_and_cat():
    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=1)
    model = build_model("llada", cfg, seed=0)
    prompts = [tok.encode("nums 1 2", add_special_tokens=False)] * 2
    seven = tok.convert_tokens_to_ids("7")
    decode = DecodeConfig(gen_length=4, block_length=4, stop_on_eos=False)
    out = generate(model, prompts, decode, seeds=[1, 2], prefill=[{0: seven, 2: seven}, {}])
    assert out.prefilled.tolist() == [[True, False, True, False], [False] * 4]
    free = generate(model, prompts[:1], decode, seeds=[3])
    assert free.prefilled is None
    both = Rollout.cat([free, out.select([1, 0])])
    assert both.prefilled.tolist() == [[False] * 4, [False] * 4, [True, False, True, False]]
    assert Rollout.cat([free, free]).prefilled is None


def inpainted_reward(prompts, completions, step_map, **columns):
    """1 for an answer holding an inpainted token (step -1 inside the answer), else 0: the policy's own samples
    all fail, IGPO's inpainted ones all succeed."""
    return [float(-1 in steps) for steps in step_map]


@pytest.mark.parametrize(("family", "keep", "trained"), [("llada", 0.2, 6), ("dream", 0.2, 6), ("sdar", 0.2, 6),
                                                           ("llada", 1.0, 32)])
def test_an_igpo_step_trains_the_top_inpainted_tokens_and_logs_the_policys_reward(
        igpo_setup, tmp_path, family, keep, trained):
    # every group fails; the hook inpaints the whole reference (ratio 1) into all 4 samples and replaces 2: each
    # replaced sample has 16 inpainted answer tokens (the reference cut at gen_length), of which
    # max(1, floor(0.2 x 16)) = 3 train
    over = rl_overrides(igpo_setup, family, tmp_path / "run", "algorithm=igpo", "train.prompts_per_step=1",
                        "rollout.gen_length=16", "rollout.block_length=16", f"inpaint_entropy_keep={keep}",
                        "rollout_hook_options={max_replacements: 2, ratio_low: 1.0, ratio_high: 1.0}")
    trainer = RLTrainer(load_config(RLConfig, None, over), reward_fn=inpainted_reward)
    try:
        m = trainer.step().metrics
    finally:
        trainer.close()
    assert (m["igpo_groups"], m["igpo_replaced"]) == (1.0, 2.0)
    assert (m["reward_policy"], m["reward"]) == (0.0, 0.5)  # 2 of 4 samples replaced by ones that score 1
    assert (m["inpaint_tokens"], m["inpaint_trained"]) == (32.0, float(trained))
    assert math.isfinite(m["loss"]) and m["ratio_dev_first_update"] == 0.0
