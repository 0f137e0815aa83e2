"""Rewards that cannot be stalled: linear boxed extraction, answer caps, and the static cost check that
keeps unevaluable answers (power towers, huge factorials, big expansions) away from math-verify."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from dllm_rl.tasks import get_task
from dllm_rl.tasks.answer_cost import evaluation_risk
from dllm_rl.tasks.extract import boxed_spans, last_boxed


def bomb(n: int, core: str = "7") -> str:
    return "\\boxed{" * n + core + "}" * n


def test_one_megabyte_nesting_bomb_gives_the_innermost_answer():
    text = bomb(125_000)
    assert len(text) == 1_000_001
    assert last_boxed(text) == ("7", "ok")
    assert last_boxed(text[:-1]) == ("7", "ok")  # one box left open, the inner ones are complete
    assert last_boxed("\\boxed{" * 125_000 + "7") == (None, "unbalanced")
    gsm = get_task("gsm8k", data=[{"question": "q", "answer": "#### 4"}])
    assert gsm.score_one(bomb(125_000, "4"), gsm.examples[0]).reason == "correct: 4"
    math = get_task("math", data=[{"problem": "p", "answer": "\\frac{1}{2}"}])
    assert math.score_one(bomb(125_000, "\\frac{1}{2}"), math.examples[0]).reason == "correct (exact match)"


def _peak_bytes(text: str) -> int:
    tracemalloc.start()
    try:
        assert last_boxed(text) == ("7", "ok")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_boxed_extraction_memory_grows_linearly_with_nesting():
    # A deterministic measure instead of wall time: the peak bytes allocated (about 80-130 per level
    # here). Copying every nested content (the old extraction) makes it grow 16x when the depth grows 4x.
    small, large = _peak_bytes(bomb(1000)), _peak_bytes(bomb(4000))
    assert large < 8 * small
    assert large < 150 * 4000
    spans, unclosed = boxed_spans(bomb(4000))
    assert len(spans) == 4000 and not unclosed
    assert spans[0] == (7, 32000) and spans[-1] == (28000, 28001)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a \\boxed{1} b \\boxed{\\frac{1}{2}} c", ("\\frac{1}{2}", "ok")),
        ("\\boxed{a \\boxed{b} c}", ("b", "ok")),
        ("\\boxed {x} and \\fbox{y}", ("y", "ok")),
        ("}} \\boxed{1}} {", ("1", "ok")),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", ("\\left( 3, \\frac{\\pi}{2} \\right)", "ok")),
        ("\\boxed{2} then \\boxed{3", ("2", "ok")),
        ("\\boxed{", (None, "unbalanced")),
        ("\\boxed", (None, "missing")),
    ],
)
def test_boxed_extraction_on_normal_inputs(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "answer, reason",
    [
        ("9^{9^{9^{9}}}", "it builds a number of about 3.7e+08 digits (max 20000)"),
        ("10^{10^{10}}", "it builds a number of about 1e+10 digits (max 20000)"),
        ("9**9**9**9", "it builds a number of about 3.7e+08 digits (max 20000)"),
        ("(9^9)!", "it builds a number of about 3.33e+09 digits (max 20000)"),
        ("1000000!", "it builds a number of about 6e+06 digits (max 20000)"),
        ("\\binom{1000000}{500000}", "it builds a number of about 1e+06 digits (max 20000)"),
        ("\\Gamma(10^{7})", "it builds a number of about 7e+07 digits (max 20000)"),
        ("1e304053986", "it builds a number of about 3.04e+08 digits (max 20000)"),
        ("(x+y+z+w)^{25}", "it expands to about 3.28e+03 terms (max 100)"),
        ("(x+1)^{60}(x+2)^{60}", "it expands to about 3.72e+03 terms (max 100)"),
        ("{{{{{{7}}}}}}", "it is nested more than 5 levels deep"),
        ("x_{1}" * 40, "it has more than 60 numbers and symbols"),
    ],
)
def test_unevaluable_answers_are_named(answer, reason):
    assert evaluation_risk(answer) == f"answer cannot be evaluated in time: {reason}"


@pytest.mark.parametrize(
    "answer",
    ["2^{100}", "10^{1000}", "1e-5", "2.5E3", "3000!", "\\binom{100}{50}", "(x+1)^{99}", "x^{-1}", "90^\\circ",
     "1" * 900, "\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "11,\\! 111,\\! 111,\\! 100", "}}2^{3}"],
)  # fmt: skip
def test_evaluable_answers_pass(answer):
    assert evaluation_risk(answer) is None


def test_power_tower_batch_never_reaches_the_verifier(monkeypatch):
    task = get_task("math", data=[{"problem": "p", "answer": "387420489"}], exact_shortcut=False)

    def no_verifier(pairs):
        raise AssertionError(f"verifier called with {pairs}")

    monkeypatch.setattr(task.verifier, "check_many", no_verifier)
    answers = ["9^{9^{9^{9}}}", "9^{9^{9}}", "10^{10^{10}}", "(9^9)!", "9!!!!", "2^{2^{2^{2^{2^{2}}}}}",
               "\\binom{10^{6}}{5}", "(x+y+z)^{99}"]  # fmt: skip
    scores = task.score_examples([f"\\boxed{{{a}}}" for a in answers], task.examples * len(answers))
    assert [float(s) for s in scores] == [0.0] * 8
    assert all(s.reason.startswith("answer cannot be evaluated in time: ") for s in scores)


def test_math_answer_cap_and_unevaluable_reference(monkeypatch):
    task = get_task("math", data=[{"problem": "p", "answer": "9^{9^{9}}"}, {"problem": "p", "answer": "1"}])
    monkeypatch.setattr(task.verifier, "check_many", lambda pairs: [(False, "called")] * len(pairs))
    bad_gold, gold = task.examples
    assert task.score_one("\\boxed{9^{9^{9}}}", bad_gold).reason == "correct (exact match)"
    assert task.score_one("\\boxed{3}", bad_gold).reason == (
        "reference answer cannot be evaluated in time: it builds a number of about 3.7e+08 digits (max 20000)"
    )
    assert task.score_one("\\boxed{" + "1" * 1001 + "}", gold).reason == "answer too long (1001 chars, max 1000)"


def test_gsm8k_long_answers_and_long_fractions():
    task = get_task("gsm8k", data=[{"question": "q", "answer": "#### 4"}])
    (ex,) = task.examples
    assert task.score_one("#### " + "9" * 2000, ex).reason == "answer too long (2000 chars, max 1000)"
    s = task.score_one("#### " + "9" * 400 + "/7", ex)
    assert s == 0.0 and s.reason == f"wrong: got {'9' * 400}/7, expected 4"


def test_countdown_rejects_powers_and_deep_parentheses_without_evaluating():
    task = get_task("countdown", data=[{"input": "3,5,7", "output": "22"}])
    (ex,) = task.examples
    assert task.score_one("<answer>9**9**9**9</answer>", ex).reason == "disallowed syntax: Pow"
    assert task.score_one("<answer>" + "(" * 150 + "3*5+7" + ")" * 150 + "</answer>", ex).reason == (
        "expression too long (305 chars)"
    )
    assert task.score_one("<answer>" + "(" * 140 + "3*5+7" + ")" * 140 + "</answer>", ex).reason == "correct"
    assert task.score_one("<answer>" + "1+" * 149 + "1</answer>", ex).reason == "expression nested too deeply"


def test_real_reference_answers_pass_the_cost_check(math500_test, gsm8k_test):
    math_answers = [json.loads(line)["answer"] for line in open(math500_test[0])]
    gsm = get_task("gsm8k", data=gsm8k_test[0])
    assert len(math_answers) == math500_test[1] and len(gsm.examples) == gsm8k_test[1]
    assert [a for a in math_answers if evaluation_risk(a)] == []
    assert [ex["final_answer"] for ex in gsm.examples if evaluation_risk(ex["final_answer"])] == []
