"""Sudoku (4x4 by default; any n x n with square boxes, e.g. 9x9).

Data: ``puzzle`` / ``Puzzle`` and ``solution`` / ``Solution``: row-major digit strings of length n*n,
``0`` = blank (the d1 / ESPO CSV format). Default file: ``sudoku/4x4_test.csv`` (split ``test``).

Prompt styles:
- ``compact``: ``"sudoku 3102200002100320\\n"`` -> completion ``"<answer>3142243142131324</answer>"``.
- ``chat`` / ``plain``: the grid as rows with ``_`` for blanks and an English instruction to answer with
  the completed grid (16 digits) inside ``<answer></answer>``.

Answer extraction: the last ``<answer>...</answer>`` (``strict=True``, default; ``strict=False`` falls
back to the whole completion); the grid is its digits 0-9 in order, ignoring every other character
(spaces, newlines, ``|``, commas), and must have exactly n*n digits.

Reward: the fraction of originally blank cells filled with the reference solution's digit. A grid
that is a complete valid sudoku and keeps every given digit is ``solved`` (reward 1.0, even if it
differs from the stored solution). ``Score.info["solved"]`` carries the flag for every score and
:meth:`SudokuTask.metrics` reports the solved rate separately.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .base import DataError, Score, Task
from .extract import tagged


def grid_size(cells: int) -> tuple[int, int]:
    """(n, box) for a grid of ``cells`` cells: n*n cells, box*box = n. Raises ValueError otherwise."""
    n = math.isqrt(cells)
    box = math.isqrt(n)
    if n * n != cells or box * box != n or n < 1:
        raise ValueError(f"a sudoku grid needs n*n cells with n a square (16, 81); got {cells}")
    return n, box


def is_valid_solution(grid: str, puzzle: str) -> bool:
    """Sudoku rule: every row, column and box holds 1..n once, and the given (non-zero) cells of
    ``puzzle`` are unchanged."""
    n, box = grid_size(len(grid))
    if len(puzzle) != len(grid) or any(p != "0" and p != g for p, g in zip(puzzle, grid)):
        return False
    want = {str(d) for d in range(1, n + 1)} if n < 10 else None
    if want is None:
        return False
    rows = [grid[r * n : (r + 1) * n] for r in range(n)]
    cols = ["".join(rows[r][c] for r in range(n)) for c in range(n)]
    boxes = [
        "".join(rows[br + r][bc + c] for r in range(box) for c in range(box))
        for br in range(0, n, box)
        for bc in range(0, n, box)
    ]
    return all(set(u) == want and len(u) == n for u in rows + cols + boxes)


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Number of solutions of a puzzle (0 = blank), counting up to ``limit`` (backtracking)."""
    n, box = grid_size(len(puzzle))
    cells = [int(c) for c in puzzle]
    count = 0

    def ok(i: int, d: int) -> bool:
        r, c = divmod(i, n)
        br, bc = r - r % box, c - c % box
        for k in range(n):
            if cells[r * n + k] == d or cells[k * n + c] == d:
                return False
        return all(cells[(br + a) * n + bc + b] != d for a in range(box) for b in range(box))

    def go(i: int) -> None:
        nonlocal count
        while i < n * n and cells[i]:
            i += 1
        if i == n * n:
            count += 1
            return
        for d in range(1, n + 1):
            if ok(i, d):
                cells[i] = d
                go(i + 1)
                cells[i] = 0
                if count >= limit:
                    return

    go(0)
    return count


def parse_grid(text: str) -> str:
    """The digits of a grid answer, in order (every non-digit character is ignored)."""
    return "".join(ch for ch in text if "0" <= ch <= "9")


def score_grid(answer: str, puzzle: str, solution: str) -> tuple[float, bool, str]:
    """Sudoku reward rule: (fraction of blank cells filled correctly, solved flag, reason)."""
    if len(answer) != len(puzzle):
        return 0.0, False, f"answer has {len(answer)} digits, need {len(puzzle)}"
    if is_valid_solution(answer, puzzle):
        return 1.0, True, "solved"
    blanks = [i for i, p in enumerate(puzzle) if p == "0"]
    if not blanks:
        return 0.0, False, "puzzle has no blank cells and the answer is not a valid grid"
    right = sum(answer[i] == solution[i] for i in blanks)
    changed = sum(p != "0" and p != a for p, a in zip(puzzle, answer))
    extra = f"; {changed} given digits changed" if changed else ""
    return right / len(blanks), False, f"{right}/{len(blanks)} blank cells correct{extra}"


def _field(row: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if row.get(n) is not None:
            return row[n]
    return None


class SudokuTask(Task):
    """Sudoku puzzles, partial-credit reward plus a ``solved`` flag (see module docstring)."""

    name: ClassVar[str] = "sudoku"
    required_fields: ClassVar = (("puzzle", "Puzzle", "quizzes"), ("solution", "Solution", "solutions"))
    # bundled: d1 / ESPO's 4x4 test set, published as a CSV in their repositories (there is no hub copy)
    default_files: ClassVar = {"test": "sudoku/4x4_test.csv"}
    prompt_styles: ClassVar = ("chat", "plain", "compact")

    def __init__(self, data: Any = None, *, strict: bool = True, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.strict = strict

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Read ``puzzle`` / ``solution`` strings and check the solution is valid for the puzzle."""
        puzzle = str(_field(row, "puzzle", "Puzzle", "quizzes")).strip()
        solution = str(_field(row, "solution", "Solution", "solutions")).strip()
        try:
            grid_size(len(puzzle))
        except ValueError as exc:
            raise DataError(f"{where}: field 'puzzle': {exc}") from exc
        if not puzzle.isdigit() or not solution.isdigit() or len(solution) != len(puzzle):
            raise DataError(
                f"{where}: 'puzzle' and 'solution' must be digit strings of equal length "
                f"(got {puzzle[:20]!r}, {solution[:20]!r})"
            )
        if not is_valid_solution(solution, puzzle):
            raise DataError(f"{where}: 'solution' is not a valid completion of 'puzzle'")
        row["puzzle"], row["solution"] = puzzle, solution
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """``sudoku <puzzle>\\n`` (compact) or the grid with ``_`` blanks and instructions."""
        puzzle = example["puzzle"]
        if self.prompt_style == "compact":
            return f"sudoku {puzzle}\n"
        n, box = grid_size(len(puzzle))
        rows = "\n".join(
            " ".join("_" if c == "0" else c for c in puzzle[r * n : (r + 1) * n]) for r in range(n)
        )
        return (
            f"Solve this {n}x{n} Sudoku. Fill every blank (_) with a digit from 1 to {n} so that each row, "
            f"each column and each {box}x{box} box contains every digit exactly once.\n\n{rows}\n\n"
            f"Give the completed grid inside <answer> </answer> tags as {n * n} digits in row order, for "
            f"example <answer>{'1' * n * n}</answer>."
        )

    def extract_answer(self, text: str) -> str | None:
        """Digits of the last ``<answer>`` (non-strict: of the whole text)."""
        ans = tagged(text)
        if ans is None and not self.strict:
            ans = text
        return None if ans is None else parse_grid(ans)

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """``<answer>{solution}</answer>``."""
        return f"<answer>{example['solution']}</answer>"

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        puzzle = str(_field(example, "puzzle", "Puzzle", "quizzes")).strip()
        solution = str(_field(example, "solution", "Solution", "solutions")).strip()
        grid = self.extract_answer(text)
        if grid is None:
            return Score(0.0, "no <answer>...</answer>", solved=False)
        value, solved, why = score_grid(grid, puzzle, solution)
        return Score(value, why, solved=solved)

    def metrics(self, scores: Sequence[Score]) -> dict[str, float]:
        """Mean reward, accuracy (reward 1.0) and ``solved`` rate."""
        out = super().metrics(scores)
        out["solved"] = sum(bool(getattr(s, "info", {}).get("solved")) for s in scores) / max(len(scores), 1)
        return out
