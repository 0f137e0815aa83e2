"""The engine's log-probabilities at commit (``add_request(logprobs=K)``): each committed token's value equals the
log-softmax of its commit step's distribution, recomputed independently from ``generate``'s step records (the state
before that step, forwarded alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from commit_logprobs import recomputed

from dllm_rl.errors import UserError
from dllm_rl.models import load_model, load_tokenizer
from dllm_rl.sampling import DecodeConfig
from dllm_rl.sampling.engine import Engine, EngineConfig

DEMO = Path(__file__).resolve().parents[2] / "src" / "dllm_rl" / "assets" / "demo"
PROMPTS = [f"nums {' '.join(map(str, row['nums']))} target {row['target']}\n"
           for row in map(json.loads, (DEMO / "countdown_heldout.jsonl").read_text().splitlines()[:2])]


@pytest.mark.parametrize("config", [DecodeConfig(gen_length=16, block_length=8, steps=8),
                                    DecodeConfig(gen_length=16, block_length=8, threshold=0.5, temperature=0.8,
                                                 top_k=5)], ids=["greedy", "sampled_top_k"])
def test_the_engine_records_each_committed_tokens_logprob_at_its_commit_step(config):
    model = load_model(DEMO / "llada-countdown")
    tok = load_tokenizer(DEMO / "llada-countdown")
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    engine = Engine(model, config, EngineConfig(slots=4))
    asked = engine.add_request(ids[0], seed=5, logprobs=3)
    engine.add_request(ids[1], seed=6)  # a neighbour that asked for none
    done = {}
    while engine.has_unfinished():
        done.update({c.request_id: c for c in engine.step()})
    got = done[asked].logprobs
    assert got is not None and done[1 - asked].logprobs is None
    tokens, values, tops = recomputed(model, ids[0], config, 5)
    assert got.tokens == tokens and sum(v is not None for v in values) >= 8
    assert [v is None for v in got.logprobs] == [v is None for v in values]
    for mine, theirs in zip(got.logprobs, values):
        if theirs is not None:
            assert mine == pytest.approx(theirs, abs=1e-5) and mine <= 0
    for mine, theirs in zip(got.top, tops):
        assert [t for t, _ in mine] == [t for t, _ in theirs]
        assert [v for _, v in mine] == pytest.approx([v for _, v in theirs], abs=1e-5)
    if config.temperature > 0:  # the top-k filter leaves 5 tokens: every alternative is one of them, mass 1
        assert all(len(t) == 3 for t, v in zip(got.top, got.logprobs) if v is not None)


def test_logprobs_outside_zero_to_twenty_are_refused():
    model = load_model(DEMO / "llada-countdown")
    engine = Engine(model, DecodeConfig(gen_length=8, block_length=8, steps=4))
    with pytest.raises(UserError, match="logprobs.*21 alternatives asked; give 0 to 20"):
        engine.add_request([5, 6, 7], logprobs=21)
