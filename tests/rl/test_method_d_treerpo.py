"""d-TreeRPO: the tree's layout, node values and sibling advantages on hand-built trees, tree rollouts through
the sampler, the self-distillation schedule and term on the facts sheet's worked example, and a trainer round."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import rl_overrides

from dllm_rl.config import load_config
from dllm_rl.estimators import TokenScores
from dllm_rl.models import build_model, tiny_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.losses import LossConfig, token_clipped_loss
from dllm_rl.rl.methods.d_treerpo import d_treerpo_loss, sd_schedule, self_distillation
from dllm_rl.rl.trainer import RLTrainer
from dllm_rl.rl.tree import TreeShape, grow_tree, node_values, sibling_advantages, until_block
from dllm_rl.sampling import DecodeConfig, generate


def test_the_tree_layout_puts_siblings_together_level_by_level():
    shape = TreeShape(root=4, branch=4, depth=2)
    assert (shape.samples, shape.leaves) == (20, 16)  # the released M = T = 4, s = 2: 20 segments, 16 leaves
    assert [shape.parent(k) for k in (0, 3, 4, 7, 8, 19)] == [-1, -1, 0, 0, 1, 3]
    assert [list(g) for g in shape.sibling_groups()][:3] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    deep = TreeShape(2, 3, 3)
    assert (deep.samples, deep.leaves, deep.offset(2), deep.parent(8), deep.parent(25)) == (26, 18, 8, 2, 7)
    assert [until_block(8, 2, lv) for lv in range(2)] == [4, 8]  # the released 8 blocks, s = 2: step 64 of 128
    assert [until_block(8, 4, lv) for lv in range(4)] == [2, 4, 6, 8]
    assert [until_block(3, 2, lv) for lv in range(2)] == [1, 3]  # not divisible: the block boundary below
    with pytest.raises(ValueError, match="root >= 1"):
        TreeShape(0, 2, 2)


def test_node_values_and_sibling_advantages_of_a_hand_built_tree():
    # the facts sheet's example: M = T = 2, s = 2; c1's leaves score [1, 0], c2's [0, 0]
    shape = TreeShape(2, 2, 2)
    values = node_values(shape, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert values.tolist() == [[0.5, 0.0, 1.0, 0.0, 0.0, 0.0]]  # [V(c1), V(c2), leaves...]
    assert sibling_advantages(shape, values).tolist() == [[0.5, -0.5, 1.0, -1.0, 0.0, 0.0]]
    # four siblings valued [1, 0, 0, 0]: A = [1, -1/3, -1/3, -1/3] (leave-one-out, no scaling)
    flat = TreeShape(4, 1, 1)
    adv = sibling_advantages(flat, node_values(flat, torch.tensor([[1.0, 0, 0, 0], [0.25, 0.75, 0.5, 0.5]])))
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1 / 3, -1 / 3, -1 / 3], [-0.33333333, 0.33333333, 0, 0]]))
    # an only child keeps its value (the released code); depth 3 averages grandchildren through children
    chain = TreeShape(2, 1, 2)
    assert sibling_advantages(chain, node_values(chain, torch.tensor([[1.0, 0.0]]))).tolist() == [
        [1.0, -1.0, 1.0, 0.0]]
    deep = TreeShape(1, 2, 3)
    assert node_values(deep, torch.tensor([[1.0, 0, 1, 1]])).tolist() == [[0.75, 0.5, 1.0, 1.0, 0, 1, 1]]


@pytest.fixture(scope="module")
def llada():
    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return build_model("llada", tiny_config("llada", **kw), seed=1)


def test_children_continue_their_parents_state_and_leaves_are_what_the_sampler_gives(llada):
    config = DecodeConfig(gen_length=8, block_length=4, steps=2, temperature=1.0, stop_on_eos=False)
    prompts = [[5, 6, 7], [9, 10]]
    shape = TreeShape(2, 3, 2)
    seed = lambda i: 7 + 31 * i  # noqa: E731

    def decode(idx, prefill, until):
        return generate(llada, [prompts[i // shape.samples] for i in idx], config, seeds=[seed(i) for i in idx],
                        prefill=prefill, until_block=until)

    tree = grow_tree(decode, shape, [2, 2], [8, 8], llada.mask_token_id)
    nodes = tree.nodes
    assert len(nodes) == 2 * shape.samples
    assert torch.equal(tree.committed.sum(-1), torch.tensor(([4] * 2 + [8] * 6) * 2))
    for p in range(2):
        for k in range(shape.root, shape.samples):
            child, parent = p * shape.samples + k, p * shape.samples + shape.parent(k)
            shared = tree.committed[parent]
            assert torch.equal(nodes.completion_ids[child][shared], nodes.completion_ids[parent][shared])
            assert (nodes.step_map[child][shared] == -1).all() and (nodes.step_map[child][~shared] >= 0).all()
            prefill = {j: int(nodes.completion_ids[parent, j]) for j in shared.nonzero().flatten().tolist()}
            alone = generate(llada, [prompts[p]], config, seeds=[seed(child)], prefill=[prefill])
            assert torch.equal(alone.completion_ids[0], nodes.completion_ids[child])
            assert torch.equal(alone.step_map[0], nodes.step_map[child])
        roots = nodes.completion_ids[p * shape.samples: p * shape.samples + 2]
        assert (roots[:, 4:] == llada.mask_token_id).all()  # level 0 stops after block 0
    leaves = nodes.completion_ids[tree.leaf_rows()]
    assert len({tuple(r) for r in leaves.tolist()}) > 1  # siblings differ: fresh randomness per child


def test_sd_schedule_matches_the_released_values():
    for p, lam, tau in [(0.0, 0.0, 2.0), (0.25, 3.04609e-4, 1.635208), (0.5, 8.06824e-4, 1.231144),
                        (1.0, 3e-3, 1e-6), (1.5, 3e-3, 1e-6)]:
        got = sd_schedule(p)
        assert got[0] == pytest.approx(lam, rel=1e-5, abs=1e-12) and got[1] == pytest.approx(tau, rel=1e-6)


def test_self_distillation_on_the_worked_example():
    # p = 0.5: kept siblings with A = [0.5, 0.25] weigh w = [0.550592, 0.449408]. Position 0: tokens [7, 9] with
    # p(7) = 0.5, p(9) = 0.25 -> KL 0.316634; position 1: both 7 with p(7) = 0.5 -> KL -log 0.5 = 0.693147.
    tau = sd_schedule(0.5)[1]
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.3], [0.25, 0.5, 0.3], [0.1, 0.1, 0.1], [0.2, 0.2, 0.2]]))
    tokens = torch.tensor([[7, 7, 1], [9, 7, 2], [7, 7, 7], [3, 3, 3]])
    active = torch.tensor([[True, True, False], [True, True, False], [True, True, True], [True, True, True]])
    adv = torch.tensor([0.5, 0.25, -0.75, 2.0])  # row 2: A < 0, not kept; row 3: alone in its group
    groups = torch.tensor([0, 0, 0, 1])
    sd = self_distillation(logp, active, tokens, adv, groups, tau)
    assert float(sd) == pytest.approx((0.316634 + 0.693147) / 2, abs=2e-6)
    # flipped signs: row 2 alone is kept in group 0 (q = its token: KL = -log 0.1 at its 3 positions); none left
    flipped = self_distillation(logp, active, tokens, -adv, groups, tau)
    assert float(flipped) == pytest.approx(-math.log(0.1), abs=1e-6)
    assert float(self_distillation(logp, active, tokens, -adv.abs(), groups, tau)) == 0.0
    # kept siblings that scored no token (nodes that decoded nothing): no position counts, the term is 0, not NaN
    assert float(self_distillation(logp, active & False, tokens, adv, groups, tau)) == 0.0
    w = torch.softmax(torch.tensor([0.5, 0.25]) / tau, 0)
    assert w.tolist() == pytest.approx([0.550592, 0.449408], abs=1e-6)
    assert -math.log(0.5) == pytest.approx(0.693147, abs=1e-6)


def test_the_loss_is_the_clipped_surrogate_plus_the_scheduled_self_distillation():
    # the worked example's siblings (rows 0-1) and a third, negative one, at progress 0.5 (lambda = 8.06824e-4)
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.3], [0.25, 0.5, 0.3], [0.1, 0.1, 0.1]]))[None]
    weight = torch.tensor([[[1.0, 1, 0], [1, 1, 0], [1, 1, 1]]])
    info = {"sibling_group": torch.tensor([4, 4, 4]), "tokens": torch.tensor([[7, 7, 1], [9, 7, 2], [7, 7, 7]])}
    new = TokenScores(logp.clone().requires_grad_(), weight, forwards=3, info=info)
    old = TokenScores(logp + 0.1, weight, forwards=3)
    adv, lengths = torch.tensor([0.5, 0.25, -0.75]), torch.tensor([3, 3, 3])
    cfg = LossConfig(epsilon=0.4, aggregation="seq_mean", progress=0.5)
    out = d_treerpo_loss(new, old, None, adv, lengths, cfg)
    surrogate = token_clipped_loss(new, old, None, adv, lengths, cfg).loss
    sd = (0.316634 + 0.693147) / 2
    assert float(out.loss.detach()) == pytest.approx(float(surrogate.detach()) + 8.06824e-4 * sd, abs=1e-8)
    assert out.stats["sd"] == pytest.approx(sd, abs=2e-6) and out.stats["sd_lambda"] == pytest.approx(8.06824e-4)
    off = d_treerpo_loss(new, old, None, adv, lengths, LossConfig(epsilon=0.4, aggregation="seq_mean",
                                                                   progress=0.5, options={"sd_lambda_max": 0.0}))
    assert float(off.loss.detach()) == float(surrogate.detach())
    with pytest.raises(ValueError, match="needs the tree_segment estimator"):
        d_treerpo_loss(TokenScores(logp, weight, forwards=3), old, None, adv, lengths, cfg)
    with pytest.raises(ValueError, match="sd_lambda not read by the 'd_treerpo' loss"):
        d_treerpo_loss(new, old, None, adv, lengths, LossConfig(options={"sd_lambda": 1.0}))


def test_a_trainer_round_is_the_tree_with_its_values_and_sibling_advantages(rl_setup, tmp_path):
    cfg = load_config(RLConfig, None, rl_overrides(rl_setup, "llada", tmp_path, "algorithm=d_treerpo",
                                                   "rollout.num_generations=2", "rollout.gen_length=8",
                                                   "rollout.block_length=4", "train.prompts_per_step=1",
                                                   "rollout_hook_options={branch: 2, depth: 2}", "train.max_steps=2",
                                                   "drop_zero_variance=false"))
    trainer = RLTrainer(cfg, reward_fn=lambda prompts, completions, **kw: [float(len(c) % 3) for c in completions])
    try:
        batch = trainer.collect()
        assert len(batch.rollout) == 6 and len(batch.rewards) == 6  # M (1 + T) = 2 (1 + 2) segments
        leaf = [float(len(t) % 3) for t in batch.rollout.texts[2:]]
        want = node_values(TreeShape(2, 2, 2), torch.tensor([leaf]))[0]
        assert batch.rewards.tolist() == want.tolist()
        assert batch.advantages.tolist() == sibling_advantages(TreeShape(2, 2, 2), want[None])[0].tolist()
        assert torch.equal(batch.rollout.step_map[:2, 4:], torch.full((2, 4), -1))  # level 0: block 0 only
        assert (batch.rollout.step_map[2:, :4] == -1).all() and (batch.rollout.step_map[2:, 4:] >= 0).all()
        trainer.step_idx = 1  # of train.max_steps = 2: the self-distillation's progress is 0.5
        metrics = trainer.step().metrics
        assert metrics["sd_lambda"] == pytest.approx(8.06824e-4) and metrics["ratio_dev_first_update"] == 0.0
    finally:
        trainer.close()
