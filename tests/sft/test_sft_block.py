"""Block SFT on a block model: the two-stream forward equals one direct forward per block."""

from __future__ import annotations

import pytest
import torch

from dllm_rl.estimators import plan_block
from dllm_rl.models import block_index, build_model, position_ids_from_valid, tiny_config
from dllm_rl.sft.data import SFTExample, collate
from dllm_rl.sft.objectives import compute_objective


@pytest.mark.parametrize("seed", [0, 1])
def test_two_stream_loss_equals_sum_of_per_block_forwards(seed):
    model = build_model("sdar", tiny_config("sdar", vocab_size=32, hidden_size=32, block_size=4), seed=seed)
    bs, mask = 4, model.mask_token_id
    # prompts of 5 and 3 tokens (partial last blocks), responses of 9 and 6 tokens (right padding in row 1)
    exs = [SFTExample([5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 30]),
           SFTExample([7, 8, 9], [20, 21, 22, 23, 24, 30])]
    batch = collate(exs, model.pad_token_id)
    out = compute_objective("block", model, batch, torch.Generator().manual_seed(seed), eps=0.2)
    rows = plan_block(model, batch, torch.Generator().manual_seed(seed), eps=0.2)
    assert torch.equal(rows.weight, out.scores.weight[0])  # same generator -> same masks

    per_row = []
    for b, ex in enumerate(exs):
        valid = batch.valid()[b]
        clean = batch.input_ids()[b][valid]
        noisy = rows.input_ids[b][valid]
        weight = rows.weight[b][batch.completion_valid[b]]
        lp = len(ex.prompt_ids)
        blk = block_index(position_ids_from_valid(torch.ones(1, len(clean), dtype=torch.bool)), bs)[0]
        total = 0.0
        for k in sorted(set(blk[lp:].tolist())):
            end = int((blk <= k).sum())
            start = int((blk < k).sum())
            ids = torch.cat([clean[:start], noisy[start:end]])[None]
            logits = model(ids).logits[0].float()  # default block-causal attention, no padding
            for col in range(max(start, lp), end):
                w = float(weight[col - lp])
                if w:
                    assert int(ids[0, col]) == mask
                    total += -w * torch.log_softmax(logits[col], -1)[clean[col]].item()
        per_row.append(total / len(ex.response_ids))
    assert (rows.weight != 0).sum() >= 4
    assert out.loss.item() == pytest.approx(sum(per_row) / 2, abs=1e-5)


def test_block_size_must_match_block_model():
    model = build_model("sdar", tiny_config("sdar", vocab_size=32, hidden_size=32, block_size=4), seed=0)
    batch = collate([SFTExample([5, 6], [7, 8, 30])], model.pad_token_id)
    with pytest.raises(ValueError, match="block_size"):
        compute_objective("block", model, batch, torch.Generator(), block_size=8)


def test_sliced_form_needs_block_size():
    model = build_model("llada", tiny_config("llada", vocab_size=32, hidden_size=32), seed=0)
    batch = collate([SFTExample([5, 6], [7, 8, 30])], model.pad_token_id)
    with pytest.raises(ValueError, match="block_size"):
        compute_objective("block", model, batch, torch.Generator())
