"""Hand-built deterministic models for the sampler tests.

``fake_model(table)`` wraps a fake HF module whose logits at a token are ``table[position]`` (a fixed
function of position), as a :class:`DiffusionLM` of a full-attention (llada) or block (sdar) family. It
records the query length of every forward and keeps a real ``DynamicCache`` (dummy keys) so the cached
paths run unchanged.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig
from transformers.modeling_utils import slice_logits_to_keep

from dllm_rl.models import DiffusionLM, get_family

V = 16
MASK, EOS, PAD = 15, 14, 13


class FakeHF(nn.Module):
    def __init__(self, table: torch.Tensor, fn=None):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.table = table
        self.fn = fn
        self.config = PretrainedConfig(vocab_size=table.shape[-1], max_position_embeddings=table.shape[0])
        self.query_lengths: list[int] = []
        self.kept_lengths: list[int] = []  # positions projected onto the vocabulary per forward

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                logits_to_keep=0):
        self.query_lengths.append(int(input_ids.shape[1]))
        logits = self.table[position_ids].clone()
        if self.fn is not None:
            logits = self.fn(input_ids, position_ids, logits)
        if use_cache:
            cache = cache if cache is not None else DynamicCache()
            kv = position_ids[:, None, :, None].float()
            cache.update(kv, kv, 0)
        logits = slice_logits_to_keep(logits, logits_to_keep)  # as the stock *ForCausalLM does
        self.kept_lengths.append(int(logits.shape[1]))
        return SimpleNamespace(logits=logits, cache=cache if use_cache else None)


def logit_for(p: float, vocab: int = V) -> float:
    """Logit a such that softmax puts probability p on one token when the other vocab-1 logits are 0."""
    return math.log(p * (vocab - 1) / (1 - p))


def table_from(rows: dict[int, tuple[int, float]], n_pos: int = 64, vocab: int = V) -> torch.Tensor:
    """``rows[pos] = (token, prob)``: at ``pos`` the model puts ``prob`` on ``token`` (uniform elsewhere).

    Unlisted positions put ``0.5 - pos / 1000`` on ``pos % 10``: distinct confidences that fall left to right.
    Equal probabilities at two positions are not exact ties after the sampler's softmax (its vectorised sum
    rounds differently with the hot token in another lane, and differently per CPU instruction set), so the
    tests never rely on them; the tie rule itself is tested on exact values in test_sampling_confidence.py.
    """
    table = torch.zeros(n_pos, vocab)
    for pos in range(n_pos):
        tok, p = rows.get(pos, (pos % min(10, vocab), 0.5 - pos / 1000))
        table[pos, tok] = logit_for(p, vocab)
    return table


def fake_model(table: torch.Tensor, family: str = "llada", block_size: int = 4, fn=None) -> DiffusionLM:
    pub = {"mask_token_id": MASK, "eos_token_id": EOS, "pad_token_id": PAD}
    if family == "sdar":
        pub["block_size"] = block_size
    return DiffusionLM(FakeHF(table, fn), get_family(family), pub)


@pytest.fixture(scope="session")
def tiny_models():
    """Small random models of each family (hidden 32, 2 layers, vocab 64), built once."""
    from dllm_rl.models import build_model, tiny_config

    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return {fam: build_model(fam, tiny_config(fam, **kw), seed=1) for fam in ("llada", "dream", "sdar")}


@pytest.fixture(scope="session")
def sharp_sdar():
    """A tiny SDAR model whose LM head is scaled up, so confidences spread over (0, 1) and thresholds bite."""
    from dllm_rl.models import build_model, tiny_config

    kw = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    m = build_model("sdar", tiny_config("sdar", **kw), seed=2)
    with torch.no_grad():
        m.model.lm_head.weight.mul_(40.0)
    return m


@pytest.fixture(scope="session")
def fakes():
    """The helpers above, as a namespace (test modules must not import conftest by name)."""
    return SimpleNamespace(V=V, MASK=MASK, EOS=EOS, PAD=PAD, FakeHF=FakeHF, logit_for=logit_for,
                           table_from=table_from, fake_model=fake_model)
