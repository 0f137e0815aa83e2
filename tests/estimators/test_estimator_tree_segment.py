"""The tree_segment estimator (d-TreeRPO): one forward on the parent state, scoring what the node committed."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, MASK, Spy, direct_logp, gen

from dllm_rl.estimators import ScoringBatch, estimate

M = MASK


def _segments() -> ScoringBatch:
    """Two tree nodes of one prompt (P=3, G=6). Node 0 was prefilled with tokens 0-1 (step -1), committed 2, 3 and
    an EOS at 4 (steps 0, 1, 1) and EOS padding at 5 (step 1, after its answer); node 1 committed tokens 0 and 2
    (steps 0, 0) and left 1 and 3-5 masked."""
    prompt = torch.tensor([[10, 11, 12], [10, 11, 12]])
    comp = torch.tensor([[20, 21, 22, 23, EOS, EOS], [30, M, 32, M, M, M]])
    mask = torch.tensor([[True, True, True, True, True, False], [True] * 6])
    steps = torch.tensor([[-1, -1, 0, 1, 1, 1], [0, -1, 0, -1, -1, -1]])
    return ScoringBatch(prompt, torch.ones(2, 3, dtype=torch.bool), comp, mask, steps)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_a_segment_is_scored_by_one_forward_on_its_parent_state(models, family):
    model, batch = models[family], _segments()
    with Spy(model) as spy:
        sc = estimate(model, "tree_segment", batch, gen(0))
    parents = torch.tensor([[10, 11, 12, 20, 21, M, M, M, M],     # node 0's parent: its prefilled tokens only
                            [10, 11, 12, M, M, M, M, M, M]])      # node 1's parent: the masked completion
    assert torch.equal(spy.inputs(), parents)
    assert sc.forwards == 2 and sc.num_draws == 1
    assert torch.equal(sc.weight[0], torch.tensor([[0.0, 0, 1, 1, 1, 0], [1, 0, 1, 0, 0, 0]]))
    hand = direct_logp(model, parents, torch.ones_like(parents, dtype=torch.bool), 3, batch.completion_ids)
    torch.testing.assert_close(sc.logp[0], hand * sc.weight[0], atol=1e-5, rtol=0)


def test_siblings_are_the_samples_sharing_a_parent_state(models):
    batch = _segments()
    sib = ScoringBatch(batch.prompt_ids[[0, 1, 1]], batch.prompt_mask[[0, 1, 1]],
                       torch.cat([batch.completion_ids, torch.tensor([[M, 41, M, 43, M, M]])]),
                       torch.ones(3, 6, dtype=torch.bool), torch.cat([batch.step_map, torch.tensor([[-1, 0, -1, 1,
                                                                                                      -1, -1]])]))
    sc = estimate(models["llada"], "tree_segment", sib, gen(0))
    group = sc.info["sibling_group"].tolist()
    assert group[1] == group[2] != group[0]  # nodes 1 and 2 both continue the masked completion
    assert torch.equal(sc.info["tokens"], sib.completion_ids)


def test_a_node_that_decoded_nothing_has_no_row_and_step_map_is_required(models):
    batch = _segments()
    batch.step_map[1] = -1
    sc = estimate(models["llada"], "tree_segment", batch, gen(0))
    assert sc.forwards == 1 and not sc.weight[0, 1].any()
    with pytest.raises(ValueError, match="needs batch.step_map"):
        estimate(models["llada"], "tree_segment", ScoringBatch(batch.prompt_ids, batch.prompt_mask,
                                                              batch.completion_ids, batch.completion_mask), gen(0))
