"""BufferCache: in-place appends, free roll-back, column drops and row selection, checked against plain tensors
and against HF's DynamicCache inside a real model forward. SlotCache (the engine's per-slot pool): a forward's keys
land at their positions in their slots and are read in place."""

import torch

from dllm_rl.models import attention_bias
from dllm_rl.sampling.kv_cache import BufferCache
from dllm_rl.sampling.slot_cache import SlotCache, StepPlan


def _kv(b, n, start):
    t = torch.arange(start, start + n, dtype=torch.float32)
    return t.view(1, 1, n, 1).expand(b, 2, n, 3).contiguous() + torch.arange(b).view(b, 1, 1, 1) * 100


def test_append_truncate_drop_select():
    cache = BufferCache()
    k, v = cache.update(_kv(2, 5, 0), _kv(2, 5, 0) * -1, 0)
    assert k.shape == (2, 2, 5, 3) and cache.get_seq_length() == 5
    cache.truncate(3)
    k, _ = cache.update(_kv(2, 100, 10), _kv(2, 100, 10), 0)  # grows past the first buffer
    assert cache.get_seq_length() == 103
    assert k[0, 0, :, 0].tolist() == [0, 1, 2] + list(range(10, 110))
    cache.truncate(6)
    cache.drop_columns(1, 4)  # [0, 1, 2, 10, 11, 12] -> [0, 11, 12]
    assert cache.layers[0].keys[1, 1, :, 0].tolist() == [100, 111, 112]
    cache.batch_select_indices(torch.tensor([1]))
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[100, 111, 112]]
    assert cache.layers[0].values.shape == (1, 2, 3, 3)


def test_model_forward_matches_dynamic_cache(tiny_models):
    model = tiny_models["llada"]
    x = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(x, dtype=torch.bool)
    pos = torch.arange(12).expand(2, -1)
    ref = model(x, attention_mask=valid).logits
    cache = BufferCache()
    with torch.no_grad():
        model(x[:, :7], attn_bias=attention_bias(valid[:, :7]), position_ids=pos[:, :7], past_key_values=cache,
              use_cache=True)
        cache.truncate(7)
        from transformers import DynamicCache

        dyn = DynamicCache()
        model(x[:, :7], attn_bias=attention_bias(valid[:, :7]), position_ids=pos[:, :7], past_key_values=dyn,
              use_cache=True)
        bias = attention_bias(valid, num_queries=5)
        a = model(x[:, 7:], attn_bias=bias, position_ids=pos[:, 7:], past_key_values=cache, use_cache=True).logits
        b = model(x[:, 7:], attn_bias=bias, position_ids=pos[:, 7:], past_key_values=dyn, use_cache=True).logits
    assert torch.equal(a, b)
    assert not torch.allclose(a, ref[:, 7:])  # keys of [0, 7) computed without the tail: not a full forward


def test_slot_cache_writes_each_query_at_its_position_and_reads_the_pool_in_place():
    pool = SlotCache(slots=3)
    pool.reserve(6)
    # A forward over slots 1 and 2, queries left-padded to 2: slot 1 writes its two at columns 3 and 4, slot 2 its
    # one (query 1; query 0 is padding) at column 0; the forward reads columns [0, 5).
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    plan = StepPlan(first=1, n=2, write_row=as_long([0, 0, 1]), write_query=as_long([0, 1, 1]),
                    write_col=as_long([3, 4, 0]), width=5)
    k = _kv(2, 2, 10)  # row r, query j: 10 + j + 100 r
    keys, values = pool.step_cache(plan).update(k, -k, 0)
    assert keys.shape == values.shape == (2, 2, 5, 3) and pool.keys[0].shape == (3, 2, 6, 3)
    assert keys.untyped_storage().data_ptr() == pool.keys[0].untyped_storage().data_ptr()  # a view, not a copy
    assert keys[:, 1, :, 0].tolist() == [[0, 0, 0, 10, 11], [111, 0, 0, 0, 0]]
    assert torch.equal(values, -keys) and not bool(pool.keys[0][0].any())  # slot 0 untouched
    assert pool.nbytes() == 2 * 3 * 2 * 6 * 3 * 4
    pool.reserve(8)  # growing keeps what is stored
    assert pool.capacity == 8 and pool.keys[0][1:, 1, :, 0].tolist() == [[0, 0, 0, 10, 11, 0, 0, 0],
                                                                          [111, 0, 0, 0, 0, 0, 0, 0]]
    pool.move(1, 0, 4)  # the engine fills a hole with the last slot's sequence: its first 4 columns
    assert pool.keys[0][0, 1, :, 0].tolist() == [0, 0, 0, 10, 0, 0, 0, 0]
    assert pool.values[0][0, 1, :, 0].tolist() == [0, 0, 0, -10, 0, 0, 0, 0]
