"""Sudoku: grid extraction, partial credit over blank cells, the solved flag, the real 4x4 test set."""

from __future__ import annotations

import pytest

from dllm_rl.tasks import get_task
from dllm_rl.tasks.sudoku import count_solutions, is_valid_solution, score_grid

PUZZLE, SOLUTION = "3102200002100320", "3142243142131324"
ROW = [{"Puzzle": PUZZLE, "Solution": SOLUTION}]


def test_partial_credit_counts_only_blank_cells():
    blanks = [i for i, c in enumerate(PUZZLE) if c == "0"]
    answer = list(SOLUTION)
    answer[blanks[0]] = "4" if SOLUTION[blanks[0]] != "4" else "1"
    value, solved, why = score_grid("".join(answer), PUZZLE, SOLUTION)
    assert value == pytest.approx((len(blanks) - 1) / len(blanks)) and not solved
    assert score_grid(PUZZLE, PUZZLE, SOLUTION)[0] == 0.0  # echoing the puzzle fills nothing
    assert score_grid("1" * 15, PUZZLE, SOLUTION)[2] == "answer has 15 digits, need 16"


@pytest.mark.parametrize(
    "completion, reward, solved",
    [
        (f"<answer>{SOLUTION}</answer>", 1.0, True),
        ("<answer>\n3 1 4 2\n2 4 3 1\n4 2 1 3\n1 3 2 4\n</answer>", 1.0, True),
        ("<answer>3142|2431|4213|1324</answer>", 1.0, True),
        (SOLUTION, 0.0, False),
        (f"<answer>{PUZZLE}</answer>", 0.0, False),
        ("<answer></answer>", 0.0, False),
    ],
)
def test_extraction_and_flag(completion, reward, solved):
    task = get_task("sudoku", data=ROW)
    s = task.score_one(completion, task.examples[0])
    assert s == reward and s.info["solved"] is solved, s.reason


def test_non_strict_reads_whole_completion_and_metrics_report_solved():
    task = get_task("sudoku", data=ROW, strict=False)
    ex = task.examples[0]
    scores = [task.score_one(SOLUTION, ex), task.score_one("nothing", ex)]
    assert scores[0] == 1.0
    assert task.metrics(scores) == {"reward": 0.5, "accuracy": 0.5, "solved": 0.5}


def test_alternative_valid_solution_counts_as_solved():
    puzzle = "1200340000000000"  # many completions
    assert count_solutions(puzzle, 5) > 1
    task = get_task("sudoku", data=[{"puzzle": puzzle, "solution": "1243342121344312"}])
    other = "1234341221434321"
    assert is_valid_solution(other, puzzle) and other != task.examples[0]["solution"]
    s = task.score_one(f"<answer>{other}</answer>", task.examples[0])
    assert s == 1.0 and s.info["solved"]


def test_compact_prompt():
    task = get_task("sudoku", data=ROW, prompt_style="compact")
    assert task.examples[0]["prompt"] == f"sudoku {PUZZLE}\n"
    assert task.reference_completion(task.examples[0]) == f"<answer>{SOLUTION}</answer>"


def test_real_4x4_test_set():
    task = get_task("sudoku")  # the default test data: the complete set, bundled
    assert task.source.endswith("assets/data/sudoku/4x4_test.csv")
    examples = task.examples
    assert len(examples) == 500
    good = task.score_examples([task.reference_completion(ex) for ex in examples], examples)
    assert all(s == 1.0 and s.info["solved"] for s in good)
    wrong = task.score_examples([f"<answer>{ex['puzzle']}</answer>" for ex in examples], examples)
    assert all(s == 0.0 and not s.info["solved"] for s in wrong)
    assert task.metrics(good)["solved"] == 1.0
