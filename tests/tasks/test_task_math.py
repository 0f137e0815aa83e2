"""MATH: last-boxed extraction, math-verify equivalence in worker processes, timeouts."""

from __future__ import annotations

import time

import pytest

from dllm_rl.tasks import get_task
from dllm_rl.tasks.extract import boxed_spans, last_boxed
from dllm_rl.tasks.math_task import MathVerifier


def test_boxed_extraction_balances_braces():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == ("\\frac{1}{2}", "ok")
    assert last_boxed("\\boxed{\\frac{1}{2}") == (None, "unbalanced")
    assert last_boxed("no box") == (None, "missing")
    assert boxed_spans("\\boxed{a{b}c} \\fbox{d}") == ([(7, 12), (20, 21)], False)
    assert last_boxed("\\boxed{2} then \\boxed{3")[0] == "2"


@pytest.mark.parametrize(
    "gold, pred, ok",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "\\dfrac12", True),
        ("(3, \\frac{\\pi}{2})", "\\left(3,\\frac{\\pi}{2}\\right)", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("x^2+1", "1+x^2", True),
        ("\\frac{1}{2}", "0.51", False),
        ("3", "4", False),
    ],
)
def test_equivalences_use_math_verify(gold, pred, ok):
    task = get_task("math", data=[{"problem": "p", "answer": gold}], exact_shortcut=False)
    s = task.score_one(f"The answer is \\boxed{{{pred}}}.", task.examples[0])
    assert (s == 1.0) is ok, s.reason
    assert "math-verify" in s.reason


def test_hung_check_scores_timeout_and_pool_recovers():
    v = MathVerifier(workers=1, timeout_s=1.0)
    try:
        start = time.monotonic()
        assert v.sleep(30) == (False, "timeout")
        assert time.monotonic() - start < 10
        assert v.check("\\frac{1}{2}", "0.5")[0] is True  # a fresh worker replaced the killed one
    finally:
        v.close()


def test_timeout_reason_reaches_the_score(monkeypatch):
    task = get_task("math", data=[{"problem": "p", "answer": "1"}], exact_shortcut=False)
    monkeypatch.setattr(task.verifier, "check_many", lambda pairs: [(False, "timeout")] * len(pairs))
    s = task.score_one("\\boxed{2}", task.examples[0])
    assert s == 0.0 and "timeout" in s.reason


def test_answer_only_in_solution_field():
    task = get_task("math", data=[{"problem": "p", "solution": "so $\\boxed{\\frac{3}{4}}$."}])
    assert task.examples[0]["answer"] == "\\frac{3}{4}"
    assert task.score_one("\\boxed{0.75}", task.examples[0]) == 1.0


def test_math500_boxed_answers_score_one(math500_test):
    path, rows = math500_test  # all 500 with the benchmark-data folder, else the bundled 50
    task = get_task("math", data=path, exact_shortcut=False)
    examples = task.examples
    assert len(examples) == rows
    scores = task.score_examples(
        [f"Thus the answer is $\\boxed{{{ex['answer']}}}$." for ex in examples], examples
    )
    bad = [(ex["answer"], s.reason) for ex, s in zip(examples, scores) if s != 1.0]
    assert not bad, bad[:5]
    wrong = task.score_examples(["\\boxed{-987654321}"] * 50, examples[:50])
    assert all(s == 0.0 for s in wrong)
