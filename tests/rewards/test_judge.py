"""The LLM judge: the exact prompts built for a hand-made completion (chunks, k_sample), strict parsing with a
counted fallback, the placement of chunk scores on decoding steps, the cache, and the inputs it refuses."""

from __future__ import annotations

import logging

import pytest
import torch
from reward_helpers import JUDGE_TEMPLATE, tiny_llama

from dllm_rl.errors import UserError
from dllm_rl.models import char_tokenizer
from dllm_rl.rewards.judge import (
    Judge,
    JudgeConfig,
    aggregate,
    chunk_positions,
    parse_score,
    place_on_steps,
)

TOK = char_tokenizer()
#: a hand-made rollout of "abcdefghij" decoded in blocks of 4, then two EOS fillers that do not count
IDS = TOK("abcdefghij", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id] * 2
STEPS = [1, 0, 1, 2, 4, 3, 3, 5, 6, 6, -1, -1]
PROCESS = "Q={{prompt}} A={{answer}} PRE={{prefix}} CHUNK={{chunk}} \\boxed{}"
#: the fields pasted raw, so that the prompts of these tests read short (test_judge_delimiting.py checks the fences)
RAW = {"delimit": False}


class Fixed:
    """A judge backend answering from a table (text -> its k outputs), counting its calls."""

    def __init__(self, answer):
        self.answer, self.calls, self.seen = answer, [], []

    def __call__(self, texts, n, seed):
        self.calls.append((list(texts), n))
        return [self.answer(t, n) for t in texts]


def _judge(answer, **kw):
    backend = Fixed(answer)
    return Judge(JudgeConfig(**kw), policy_tokenizer=TOK, generator=backend), backend


def test_process_prompts_chunk_by_tokens_and_the_step_placement():
    judge, backend = _judge(lambda t, n: [f"ok \\boxed{{{len(t) % 3 - 1}}}"] * n, mode="process", template=PROCESS,
                            chunk_length=4, k_sample=3, **RAW)
    cols = {"answer": ["42"], "completion_ids": [IDS], "step_map": [STEPS]}
    reqs = judge.requests(["2*21?"], ["abcdefghij"], cols)[0]
    assert [r.text for r in reqs] == [
        "Q=2*21? A=42 PRE=abcd CHUNK=abcd \\boxed{}",
        "Q=2*21? A=42 PRE=abcdefgh CHUNK=efgh \\boxed{}",
        "Q=2*21? A=42 PRE=abcdefghij CHUNK=ij \\boxed{}"]
    assert [r.positions for r in reqs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    out = judge(["2*21?"], ["abcdefghij"], **cols)
    # greedy: one generation per chunk serves its three judgements
    assert backend.calls == [([r.text for r in reqs], 1)]
    chunk = [len(r.text) % 3 - 1 for r in reqs]
    # distinct steps 0..6; chunk 0's latest step is 2, chunk 1's is 5, chunk 2's is 6
    assert out == [[0.0, 0.0, chunk[0], 0.0, 0.0, chunk[1], chunk[2]]]


def test_process_prompts_chunk_by_decoding_steps():
    judge, _ = _judge(lambda t, n: ["\\boxed{1}"] * n, mode="process", template=PROCESS, chunk_by="steps",
                      chunk_length=2, **RAW)
    cols = {"answer": ["42"], "completion_ids": [IDS], "step_map": [STEPS]}
    reqs = judge.requests(["q"], ["abcdefghij"], cols)[0]
    assert [r.positions for r in reqs] == [[0, 1, 2], [3, 5, 6], [4, 7], [8, 9]]
    assert [r.text.split("PRE=")[1] for r in reqs] == [
        "abc CHUNK=abc \\boxed{}", "abcdefg CHUNK=dfg \\boxed{}", "abcdefgh CHUNK=eh \\boxed{}",
        "abcdefghij CHUNK=ij \\boxed{}"]
    assert judge(["q"], ["abcdefghij"], **cols) == [[0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]]
    # without completion_ids the text is encoded with the policy's tokenizer (the same ids here)
    assert judge.requests(["q"], ["abcdefghij"], {"answer": ["42"], "step_map": [STEPS]})[0] == reqs


def test_step_placement_by_hand():
    # chunks sharing a step add up; a chunk with no counted token goes to the latest step before it
    steps = [0, 2, 2, -1, -1, 1]
    assert chunk_positions(6, steps, "tokens", 2) == [[0, 1], [2, 3], [4, 5]]
    assert place_on_steps([1.0, 10.0, 100.0], [[0, 1], [2, 3], [4, 5]], steps) == [0.0, 100.0, 11.0]
    assert place_on_steps([5.0], [[0, 1]], [-1, 3]) == [5.0]
    assert place_on_steps([5.0], [[0]], [-1, 3]) == [5.0]  # nothing counted before: the first step
    assert place_on_steps([1.0], [[0]], [-1]) == []


def test_parsing_is_strict_and_a_failure_is_counted_and_logged(caplog):
    pattern = JudgeConfig().score_pattern
    assert parse_score("reason... \\boxed{1} then \\boxed{-1}", pattern, -1, 1) == -1.0  # the last one
    assert parse_score("\\boxed{ 0.5 }", pattern, -1, 1) == 0.5
    assert parse_score("\\boxed{yes}", pattern, -1, 1) is None
    assert parse_score("\\boxed{7}", pattern, -1, 1) is None  # out of range
    assert parse_score("", pattern, -1, 1) is None
    outputs = {"good": "\\boxed{1}", "bad": "\\boxed{yes}", "empty": ""}
    judge, _ = _judge(lambda t, n: [outputs[t.split("|")[1]]] * n, template="{{prompt}}|{{completion}}",
                      fallback=-0.25, **RAW)
    with caplog.at_level(logging.WARNING, logger="dllm_rl.rewards.judge"):
        got = judge(["p", "p", "p"], ["good", "bad", "empty"])
    assert got == [1.0, -0.25, -0.25]
    assert judge.stats == {"judge_prompts": 3, "judge_cache_hits": 0, "judge_failures": 2}
    assert caplog.text.count("judge: 2 of 3 judgement(s) without a score matching") == 1
    assert "score the fallback -0.25" in caplog.text


def test_k_sample_sampled_judgements_and_their_aggregation():
    votes = ["\\boxed{1}", "\\boxed{-1}", "\\boxed{1}"]
    for how, want in (("mean", 1 / 3), ("consistency", 0.5)):
        judge, backend = _judge(lambda t, n: votes[:n], template="{{prompt}}{{completion}}", k_sample=3,
                                temperature=1.0, aggregate=how, disagreement=0.5, **RAW)
        assert judge(["p"], ["c"]) == [pytest.approx(want)]
        assert backend.calls == [(["pc"], 3)]
    assert aggregate([1.0, 1.0], "consistency", 0.5) == 1.0


def test_the_cache_avoids_repeated_calls_on_a_real_tiny_judge(tmp_path):
    tiny_llama(tmp_path / "judge", "LlamaForCausalLM", chat_template=JUDGE_TEMPLATE, layers=1)
    cfg = JudgeConfig(model=str(tmp_path / "judge"), template="{{prompt}}:{{completion}}", device="cpu",
                      dtype="float32", max_new_tokens=3, batch_size=2)
    judge = Judge(cfg)
    calls = []
    real = judge.generate.model.generate
    judge.generate.model.generate = lambda *a, **k: calls.append(k["input_ids"].shape) or real(*a, **k)
    assert judge.generate.chat("p:c") == "[p:c]>"
    first = judge(["p", "p", "q"], ["c", "c", "c"])  # two distinct judge prompts: one batch of two
    assert calls == [torch.Size([2, 24])]  # "[" "```\np\n```\n:\n```\nc\n```" "]>": the fields fenced
    assert judge.stats["judge_prompts"] == 2 and judge.stats["judge_cache_hits"] == 1
    # the untrained judge writes no score: every judgement is a counted failure scored by the fallback
    assert first == [0.0, 0.0, 0.0] and judge.stats["judge_failures"] == 2
    judge(["q", "p"], ["c", "c"])
    assert len(calls) == 1 and judge.stats["judge_cache_hits"] == 3  # the repeated "p:c" of the first call, then 2
    judge(["r"], ["c"])
    assert len(calls) == 2


def test_bad_judges_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match=r"^judge.model: cannot load '.*nothing' as a causal LM") as e:
        Judge(JudgeConfig(model=str(tmp_path / "nothing"), device="cpu"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"^judge.template: the template has no \{\{completion\}\} placeholder, which "
                                        r"mode=outcome needs"):
        Judge(JudgeConfig(model="unused", template="rate {{prompt}}"), generator=Fixed(None))
    with pytest.raises(UserError, match=r"^rewards\[2\].judge.template: the template has no \{\{chunk\}\} or "
                                        r"\{\{prefix\}\} placeholder"):
        Judge(JudgeConfig(model="unused", mode="process", template="{{prompt}}{{completion}}"),
              key="rewards[2].judge", generator=Fixed(None))
    judge, _ = _judge(lambda t, n: ["\\boxed{1}"] * n, template="{{prompt}}{{completion}}{{gold}}")
    with pytest.raises(UserError, match=r"^judge.template: placeholder \{\{gold\}\} is neither a judge field nor a "
                                        r"data column \(columns: completion, prompt\)"):
        judge(["p"], ["c"])
    process, _ = _judge(lambda t, n: ["\\boxed{1}"] * n, mode="process")
    with pytest.raises(UserError, match="^judge: mode=process needs the rollout's step_map column"):
        process(["p"], ["c"])
    with pytest.raises(UserError, match="score_pattern: needs exactly one capture group"):
        JudgeConfig(score_pattern="\\d+")
