"""Fixtures for the estimator tests: tiny models of each family, a batch, and a spy on model inputs."""

from __future__ import annotations

import pytest
import torch

from dllm_rl.estimators import ScoringBatch
from dllm_rl.models import build_model, tiny_config

FAMILIES = ("llada", "dream", "sdar")
VOCAB = 64
MASK = VOCAB - 1  # tiny_config: mask = V-1, eos = pad = V-2
EOS = VOCAB - 2


def tiny(family: str, seed: int = 0):
    cfg = tiny_config(family, vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, block_size=4)
    model = build_model(family, cfg, seed=seed)
    # Sharpen the random model a little so log-probs depend visibly on the context.
    with torch.no_grad():
        model.model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def models():
    return {f: tiny(f) for f in FAMILIES}


def make_batch(seed: int = 0) -> ScoringBatch:
    """3 samples, P=5 (sample 0 left-padded by 2), G=8.

    sample 0: answer of 6 tokens ending in EOS, then 2 EOS padding tokens (uncounted);
    sample 1: all 8 counted;  sample 2: answer of 3 tokens then EOS padding.
    """
    g = torch.Generator().manual_seed(seed)
    b, p, n = 3, 5, 8
    prompt = torch.randint(0, EOS, (b, p), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    prompt_mask[0, :2] = False
    prompt[0, :2] = EOS
    comp = torch.randint(0, EOS, (b, n), generator=g)
    lengths = [6, 8, 3]
    comp_mask = torch.zeros(b, n, dtype=torch.bool)
    for i, length in enumerate(lengths):
        comp_mask[i, :length] = True
        if length < n:
            comp[i, length - 1 :] = EOS
    step_map = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    return ScoringBatch(prompt, prompt_mask, comp, comp_mask, step_map)


@pytest.fixture
def batch() -> ScoringBatch:
    return make_batch()


class Spy:
    """Records every ``input_ids`` (and custom layout args) the model is called with."""

    def __init__(self, model):
        self.calls: list[dict] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        assert not args, "estimators call the model with keyword arguments"
        self.calls.append({k: v.detach().clone() for k, v in kwargs.items() if torch.is_tensor(v)})

    def inputs(self) -> torch.Tensor:
        return torch.cat([c["input_ids"] for c in self.calls])

    def close(self):
        self.handle.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def direct_logp(model, ids: torch.Tensor, valid: torch.Tensor, prompt_len: int, targets: torch.Tensor):
    """By hand: one plain forward with the family's own attention, float32 log-softmax at the completion."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=valid).logits[:, prompt_len:].float()
    return torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def blockwise_logp(model, noisy: torch.Tensor, valid: torch.Tensor, prompt_len: int, targets: torch.Tensor,
                   block_size: int = 4):
    """By hand, for a block model: a completion token of block ``j`` is scored by a plain block-causal forward
    of the clean sequence (``targets`` in the completion) with block ``j`` taken from ``noisy`` and every later
    completion token masked: the context the block sampler gives block ``j``. ``noisy`` ``[1, P + G]``."""
    clean = noisy.clone()
    clean[:, prompt_len:] = targets
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    blk = pos // block_size
    out = torch.zeros(targets.shape[-1])
    for j in blk[0, prompt_len:].unique().tolist():
        ids = clean.clone()
        in_j = blk[0] == j
        ids[0, in_j] = noisy[0, in_j]
        later = (blk[0] > j) & (torch.arange(ids.shape[1]) >= prompt_len)
        ids[0, later] = MASK
        lp = direct_logp(model, ids, valid, prompt_len, targets)[0]
        cols = in_j[prompt_len:]
        out[cols] = lp[cols]
    return out


def fed_rows(model, spy: Spy, rows) -> torch.Tensor:
    """The masked ``[prompt | completion]`` rows the model was fed. Block models are fed the two-stream
    layout: check it was built from the planner's rows (clean sequence + noisy copy) and return those."""
    if not model.is_block_causal:
        return spy.inputs()
    from dllm_rl.models.masks import two_stream_layout

    assert rows.clean_ids is not None, "block models score in the two-stream layout"
    want = two_stream_layout(rows.clean_ids, rows.input_ids, rows.valid, rows.prompt_lengths, model.block_size,
                             pad_token_id=model.pad_token_id).input_ids
    assert torch.equal(spy.inputs(), want)
    return rows.input_ids
