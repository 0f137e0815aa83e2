"""Countdown: safe AST evaluation, the each-number-once rule, strictness, and the real cd3 test set."""

from __future__ import annotations

import pytest

from dllm_rl.tasks import get_task
from dllm_rl.tasks.countdown import ExpressionError, check_countdown, evaluate_expression, solve_countdown

ROW = [{"input": "3,5,7", "output": "22"}]


@pytest.mark.parametrize(
    "expr, why",
    [
        ("__import__('os').system('true')", "disallowed syntax"),
        ("3**5", "disallowed syntax: Pow"),
        ("-3+5", "disallowed syntax: USub"),
        ("3.5+1", "disallowed syntax: Constant"),
        ("a+b", "Name"),
        ("(3+5", "not an arithmetic expression"),
        ("3/(5-5)", "division by zero"),
        ("1" * 400, "too long"),
        ("True+1", "Constant"),
        ("[3][0]", "disallowed syntax"),
    ],
)
def test_only_arithmetic_is_evaluated(expr, why):
    with pytest.raises(ExpressionError, match=why):
        evaluate_expression(expr)


def test_exact_rational_evaluation_and_numbers_used():
    value, used = evaluate_expression("(7 - 5) / 3 * 9")
    assert value == 6 and sorted(used) == [3, 5, 7, 9]
    assert check_countdown("3*5+7", [7, 5, 3], 22) == (True, "correct")
    assert not check_countdown("3*5+7+3", [3, 5, 7], 25)[0]  # 3 used twice
    assert "numbers used" in check_countdown("15+7", [3, 5, 7], 22)[1]  # 5 unused
    assert "equals 8" in check_countdown("3+5", [3, 5], 7)[1]


@pytest.mark.parametrize(
    "completion, strict, reward",
    [
        ("<answer>3*5+7</answer>", True, 1.0),
        ("think... <answer> (5*3) + 7 = 22 </answer>", True, 1.0),
        ("3*5+7", True, 0.0),
        ("3*5+7", False, 1.0),
        ("so:\n<answer>3*5+7", False, 1.0),
        ("<answer>3*5+7</answer> <answer>3+5+7</answer>", True, 0.0),
        ("<answer>7+3*5</answer>", True, 1.0),
    ],
)
def test_strict_requires_tags(completion, strict, reward):
    task = get_task("countdown", data=ROW, strict=strict)
    assert task.score_one(completion, task.examples[0]) == reward


def test_compact_prompt_format():
    task = get_task("countdown", data=ROW, prompt_style="compact")
    assert task.examples[0]["prompt"] == "nums 3 5 7 target 22\n"
    assert task.build_prompt(task.examples[0]) == "nums 3 5 7 target 22\n"


def test_solver_finds_solutions_that_verify():
    for nums, target in [([3, 5, 7], 22), ([2, 3, 7], 1), ([4, 6, 8, 3], 24), ([1, 5, 6, 7], 21)]:
        sol = solve_countdown(nums, target)
        assert sol is not None and check_countdown(sol, nums, target)[0], (nums, target, sol)
    assert solve_countdown([1, 1], 5) is None


def test_cd3_test_set_solutions_score_one_and_wrong_scores_zero():
    task = get_task("countdown")  # the default test data: the complete set, bundled
    assert task.source.endswith("assets/data/countdown/cd3_test.jsonl")
    examples = task.examples
    assert len(examples) == 256
    refs = [task.reference_completion(ex) for ex in examples]
    unsolvable = [ex["input"] for ex, r in zip(examples, refs) if r is None]
    assert unsolvable == []  # the file has no solutions; the exhaustive solver finds one for every row
    solved = [(ex, r) for ex, r in zip(examples, refs) if r is not None]
    scores = task.score_examples([r for _, r in solved], [ex for ex, _ in solved])
    assert all(s == 1.0 for s in scores), [s.reason for s in scores if s != 1.0][:5]
    wrong = task.score_examples(
        ["<answer>" + "+".join(map(str, ex["nums"])) + "+1</answer>" for ex in examples], examples
    )
    assert all(s == 0.0 for s in wrong)
