"""GSM8K answer extraction and numeric reward, on rules and on the real test set."""

from __future__ import annotations

import pytest

from dllm_rl.tasks import get_task
from dllm_rl.tasks.extract import parse_number
from dllm_rl.tasks.gsm8k import extract_gsm8k_answer

ROW = [{"question": "How many?", "answer": "Some work <<2*3=6>>6.\n#### 1,200"}]


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{1200}",
        "\\boxed{1,200}",
        "#### 1200",
        "#### $1,200.00",
        "The answer is 1200 dollars.",
        "the final answer is: 1200.0",
        "so \\boxed{\\$1,200} total",
        "\\boxed{\\text{1200 apples}}",
        "#### 5\n...\n#### 1200",
        "x = \\boxed{x = 1200}",
    ],
)
def test_correct_forms(completion):
    task = get_task("gsm8k", data=ROW)
    s = task.score_one(completion, task.examples[0])
    assert s == 1.0, (completion, s.reason)


@pytest.mark.parametrize(
    "completion, reason",
    [
        ("\\boxed{1201}", "wrong: got 1201, expected 1200"),
        ("1200", "no final answer"),
        ("\\boxed{many}", "no number"),
        ("\\boxed{12", "unbalanced"),
        ("#### 1200\nbut \\boxed{7}", "wrong: got 7"),
    ],
)
def test_wrong_forms(completion, reason):
    task = get_task("gsm8k", data=ROW)
    s = task.score_one(completion, task.examples[0])
    assert s == 0.0 and reason in s.reason


def test_number_parsing_rules():
    assert parse_number("18.0") == 18
    assert parse_number("-3") == -3
    assert parse_number("\\frac{3}{4}") == parse_number("0.75") == parse_number("3/4")
    assert parse_number("50%") == 50
    assert parse_number("no digits") is None
    assert extract_gsm8k_answer("nothing")[0] is None


def test_reference_completion_strips_calculator_annotations():
    task = get_task("gsm8k", data=ROW)
    ref = task.reference_completion(task.examples[0])
    assert "<<" not in ref and task.score_one(ref, task.examples[0]) == 1.0


def test_real_test_set_answers_score_one(gsm8k_test):
    path, rows = gsm8k_test  # all 1319 with the benchmark-data folder, else the bundled 50
    task = get_task("gsm8k", data=path)
    examples = task.examples
    assert len(examples) == rows
    for style in ("\\boxed{{{}}}", "#### {}", "The answer is {}."):
        scores = task.score_examples([style.format(ex["final_answer"]) for ex in examples], examples)
        bad = [(ex["final_answer"], s.reason) for ex, s in zip(examples, scores) if s != 1.0]
        assert not bad, (style, bad[:5])
    wrong = task.score_examples(
        [f"\\boxed{{{ex['final_answer']}1}}" for ex in examples[:200]], examples[:200]
    )
    assert all(s == 0.0 for s in wrong)
