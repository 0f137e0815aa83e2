"""Fixtures for the SFT tests: a "table" model whose logits at a position depend only on the token there."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rl.models import build_model, tiny_config

V = 8  # vocabulary: 0..5 ordinary tokens, 6 = eos = pad, 7 = mask
MASK, EOS = 7, 6
# The distribution predicted at a masked position: p[v] (sums to 1).
P_MASK = [0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05]


def rotated(shift: int) -> list[float]:
    """Distribution predicted at a position holding an ordinary token: P_MASK rotated by ``shift``."""
    return P_MASK[-shift:] + P_MASK[:-shift] if shift else list(P_MASK)


def table(token: int) -> list[float]:
    return P_MASK if token == MASK else rotated(token + 1)


def logp(token_at_position: int, target: int) -> float:
    """Hand value: log-probability of ``target`` read from a position holding ``token_at_position``."""
    return math.log(table(token_at_position)[target])


def make_table_model(family: str, block_size: int = 4):
    """A real 1-layer model of ``family`` whose raw logits at i are log(table(token_i)).

    All attention / MLP output weights are zero, so the residual stream is the embedding; embeddings are
    sqrt(H) * one-hot (RMS 1, RMSNorm eps ~0) and the head maps one-hot(token) to log(table(token)).
    """
    h = V
    pub = tiny_config(family, vocab_size=V, hidden_size=h, num_layers=1, num_heads=2, num_kv_heads=2,
                      intermediate_size=8, block_size=block_size)
    pub["rms_norm_eps"] = 1e-30
    dlm = build_model(family, pub, seed=0)
    m = dlm.model
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
        m.model.embed_tokens.weight.copy_(math.sqrt(h) * torch.eye(V, h))
        z = torch.tensor([[math.log(x) for x in table(t)] for t in range(V)])  # [token, vocab]
        m.lm_head.weight.copy_(z.t() / math.sqrt(h))
    assert dlm.mask_token_id == MASK and dlm.eos_token_id == EOS
    return dlm


@pytest.fixture
def table_model():
    return make_table_model
