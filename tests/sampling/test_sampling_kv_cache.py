"""BufferCache: in-place appends, free roll-back, column drops and row selection, checked against plain tensors
and against HF's DynamicCache inside a real model forward."""

import torch

from dllm_rl.models import attention_bias
from dllm_rl.sampling.kv_cache import BufferCache


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
