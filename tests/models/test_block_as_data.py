"""The block of a block model travels as data: ``forward(block_size=)``, ``DecodeConfig.block_size`` (recorded as
``Rollout.block_size``) and ``ScoringBatch.block_size``. A block-4 model run at block 8 this way must give exactly
what the same weights built with block 8 in their config give, and its own ``block_size`` never changes."""

from __future__ import annotations

import pytest
import torch

from dllm_rl.errors import UserError
from dllm_rl.estimators import ScoringBatch, estimate
from dllm_rl.models import build_model, tiny_config
from dllm_rl.sampling import DecodeConfig, generate
from dllm_rl.sampling.inputs import check_inputs


@pytest.fixture(scope="module")
def pair():
    """The same weights as a block-4 and a block-8 model."""
    four = build_model("sdar", tiny_config("sdar", block_size=4), seed=5)
    eight = build_model("sdar", tiny_config("sdar", block_size=8), seed=5)
    eight.load_state_dict(four.state_dict())
    return four, eight


def test_forward_at_another_block_equals_a_model_of_that_block(pair):
    four, eight = pair
    x = torch.randint(0, 60, (2, 13))
    torch.testing.assert_close(four(x, block_size=8).logits, eight(x).logits, atol=0, rtol=0)
    # and it is not the block-4 rule: position 3 sees position 5 only at block 8
    y = x.clone()
    y[:, 5] = (y[:, 5] + 1) % 60
    assert (four(y, block_size=8).logits[:, 3] - four(x, block_size=8).logits[:, 3]).abs().max() > 1e-6
    torch.testing.assert_close(four(y).logits[:, 3], four(x).logits[:, 3], atol=0, rtol=0)
    assert four.block_size == 4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_at_another_block_equals_a_model_of_that_block(pair, temperature):
    four, eight = pair
    prompts = [[3, 9, 14], [7, 1, 2, 8, 30, 5, 11, 6, 2]]
    cfg = DecodeConfig(gen_length=16, threshold=0.5 if temperature else None, temperature=temperature, seed=3)
    there = generate(four, prompts, DecodeConfig(**{**cfg.__dict__, "block_size": 8}))
    native = generate(eight, prompts, cfg)
    assert torch.equal(there.completion_ids, native.completion_ids)
    assert torch.equal(there.step_map, native.step_map) and torch.equal(there.nfe, native.nfe)
    assert there.block_size == 8 and native.block_size == 8 and four.block_size == 4
    at_four = generate(four, prompts, cfg)
    assert at_four.block_size == 4 and not torch.equal(at_four.nfe, there.nfe)  # a real change of block


@pytest.mark.parametrize("name,options", [("trace", {}), ("elbo", {"num_mc": 2}), ("block", {})])
def test_scoring_at_another_block_equals_a_model_of_that_block(pair, name, options):
    four, eight = pair
    roll = generate(eight, [[3, 9, 14], [7, 1, 2, 8, 30]], DecodeConfig(gen_length=16, threshold=0.5))
    batch = ScoringBatch.from_rollout(roll)
    assert batch.block_size == 8  # the rollout says which block its trace is in
    there = estimate(four, name, batch, torch.Generator().manual_seed(0), **options)
    native = estimate(eight, name, batch, torch.Generator().manual_seed(0), **options)
    torch.testing.assert_close(there.logp, native.logp, atol=1e-6, rtol=0)
    assert torch.equal(there.weight, native.weight)
    assert batch.select([0]).block_size == 8  # micro-batches keep it
    own = estimate(four, name, ScoringBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                            batch.completion_mask, batch.step_map),
                   torch.Generator().manual_seed(0), **options)
    assert not torch.allclose(own.logp, there.logp)  # unset: the model's own block 4, a different layout


def test_full_attention_models_refuse_a_block_size():
    llada = build_model("llada", tiny_config("llada"), seed=0)
    with pytest.raises(UserError, match=r"block_size \(8\) is the attention block of block models"):
        check_inputs(llada, [[1, 2]], DecodeConfig(gen_length=32, block_size=8), None)
    x = torch.randint(0, 60, (1, 6))
    torch.testing.assert_close(llada(x, block_size=2).logits, llada(x).logits, atol=0, rtol=0)
