"""Synthetic training / test data for countdown, sudoku and arithmetic, made offline and reproducibly.

Every generator takes ``n``, ``seed`` and a difficulty knob, returns ``n`` distinct rows (deduplicated
by :func:`row_key`) and never returns a row whose key is in ``exclude`` -- pass the keys of a test file
to make a disjoint training set (:func:`make_split_pair` does both). The random stream depends on
``(kind, split, seed)``, so ``split="train"`` and ``split="test"`` differ even with the same seed.

Difficulty knobs (``DIFFICULTY`` holds the ``easy`` / ``medium`` / ``hard`` presets):

- countdown: ``numbers`` (how many numbers, default 3) and ``max_value`` (numbers drawn from
  1..max_value, default 100); the target is the value of a random expression over all the numbers and
  lies in 1..``max_target`` (default ``max_value``). Every row stores one reference ``solution``.
- sudoku: ``blanks`` (blank cells, default 8 for 4x4) and ``size`` (4 or 9); every puzzle has a unique
  solution.
- arith: ``operands`` (how many numbers, default 3) and ``digits`` (digits per number, default 2), ops
  from ``ops`` (default ``+-*``), evaluated with the usual precedence.

Row formats match the tasks: countdown ``{"input": "3,5,7", "output": "22", "nums", "target",
"solution"}`` (the d1/ESPO format plus parsed columns); sudoku ``{"puzzle", "solution"}``; arith
``{"expression", "answer"}``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError

from .base import read_rows
from .countdown import check_countdown, parse_numbers
from .sudoku import count_solutions, grid_size

KINDS = ("countdown", "sudoku", "arith")
DIFFICULTY: dict[str, dict[str, dict[str, int]]] = {
    "countdown": {
        "easy": {"numbers": 3, "max_value": 20},
        "medium": {"numbers": 3, "max_value": 100},
        "hard": {"numbers": 4, "max_value": 100},
    },
    "sudoku": {"easy": {"blanks": 6}, "medium": {"blanks": 8}, "hard": {"blanks": 10}},
    "arith": {
        "easy": {"operands": 2, "digits": 1},
        "medium": {"operands": 3, "digits": 2},
        "hard": {"operands": 4, "digits": 3},
    },
}


def row_key(kind: str, row: dict[str, Any]) -> str:
    """Identity of a row for deduplication and train/test disjointness.

    countdown: sorted numbers + target (order of numbers does not make a new puzzle); sudoku: the
    puzzle string; arith: the expression with spaces removed.
    """
    if kind == "countdown":
        nums = parse_numbers(row.get("nums", row.get("input", row.get("numbers"))), "row")
        target = int(str(row.get("target", row.get("output"))).strip())
        return f"{sorted(nums)}->{target}"
    if kind == "sudoku":
        return str(row.get("puzzle", row.get("Puzzle"))).strip()
    if kind == "arith":
        return str(row.get("expression", row.get("question"))).replace(" ", "")
    raise UserError(f"unknown synthetic kind {kind!r}; choose one of {', '.join(KINDS)}")


def keys_of(kind: str, paths: Iterable[str | Path]) -> set[str]:
    """The :func:`row_key` of every row in the given files (for ``exclude``)."""
    keys: set[str] = set()
    for p in paths:
        for _, row in read_rows(p):
            keys.add(row_key(kind, row))
    return keys


def _rng(kind: str, split: str, seed: int) -> random.Random:
    return random.Random(f"dllm-rl/{kind}/{split}/{seed}")


def _collect(kind: str, n: int, make_one, exclude: set[str], max_tries: int, key=None) -> list[dict[str, Any]]:
    """``n`` rows from ``make_one`` (None: draw again) whose ``key`` (default :func:`row_key`) is new."""
    key = key or (lambda row: row_key(kind, row))
    if n < 0:
        raise UserError(f"--n must be >= 0, got {n}")
    rows: list[dict[str, Any]] = []
    seen = set(exclude)
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > max_tries:
            raise UserError(
                f"could only make {len(rows)} distinct {kind} rows of {n} requested after "
                f"{max_tries} tries: the difficulty setting allows too few distinct puzzles "
                "(raise the knob or lower --n)"
            )
        row = make_one()
        if row is None:
            continue
        k = key(row)
        if k in seen:
            continue
        seen.add(k)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ countdown
def random_countdown(
    rng: random.Random, numbers: int, max_value: int, max_target: int
) -> dict[str, Any] | None:
    """One countdown row: random numbers, and a target reached by a random expression over all of them
    (exact division only, positive intermediate values). None when the draw misses the target range."""
    nums = [rng.randint(1, max_value) for _ in range(numbers)]
    items: list[tuple[int, str, str]] = [(v, str(v), "atom") for v in nums]  # value, text, top operator
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ea, oa), (b, eb, ob) = items[i], items[j]
        ops = ["+", "*"]
        if a > b:
            ops.append("-")
        if b and a % b == 0 and b != 1:
            ops.append("/")
        op = rng.choice(ops)
        if op == "+":
            value, text = a + b, f"{ea}+{eb}"
        elif op == "*":
            value, text = a * b, f"{_par(ea, oa, '*')}*{_par(eb, ob, '*')}"
        elif op == "-":
            value, text = a - b, f"{ea}-{_par(eb, ob, '-')}"
        else:
            value, text = a // b, f"{_par(ea, oa, '/')}/{_par(eb, ob, '/', right=True)}"
        items = [x for k, x in enumerate(items) if k not in (i, j)] + [(value, text, op)]
    value, text, _ = items[0]
    if not 1 <= value <= max_target:
        return None
    if not check_countdown(text, nums, value)[0]:  # defensive: the stored solution must verify
        return None
    return {
        "input": ",".join(map(str, nums)),
        "output": str(value),
        "nums": nums,
        "target": value,
        "solution": text,
    }


def _par(expr: str, top: str, op: str, right: bool = False) -> str:
    if top == "atom":
        return expr
    if op == "*" and top in "+-":
        return f"({expr})"
    if op == "-" and top in "+-":
        return f"({expr})"
    if op == "/" and (top in "+-" or right):
        return f"({expr})"
    return expr


def make_countdown(
    n: int,
    seed: int = 0,
    *,
    numbers: int = 3,
    max_value: int = 100,
    max_target: int | None = None,
    split: str = "train",
    exclude: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """``n`` distinct solvable countdown rows (see module docstring for the knobs)."""
    if numbers < 2 or max_value < 1:
        raise UserError("countdown needs --numbers >= 2 and --max-value >= 1")
    rng = _rng("countdown", split, seed)
    top = max_target or max_value
    return _collect(
        "countdown",
        n,
        lambda: random_countdown(rng, numbers, max_value, top),
        set(exclude),
        max_tries=200 * n + 1000,
    )


# --------------------------------------------------------------------------------------------- sudoku
def random_full_grid(rng: random.Random, size: int = 4) -> str:
    """A uniformly shuffled valid solved grid: a base pattern with digits relabelled, rows shuffled within
    bands, bands shuffled, columns within stacks, stacks, and an optional transpose."""
    n, box = grid_size(size * size)
    base = [[(box * (r % box) + r // box + c) % n for c in range(n)] for r in range(n)]
    digits = list(range(1, n + 1))
    rng.shuffle(digits)

    def order() -> list[int]:
        bands = list(range(box))
        rng.shuffle(bands)
        out = []
        for b in bands:
            inner = list(range(box))
            rng.shuffle(inner)
            out += [b * box + i for i in inner]
        return out

    rows, cols = order(), order()
    grid = [[digits[base[r][c]] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(x) for x in zip(*grid)]
    return "".join(str(d) for row in grid for d in row)


def random_sudoku(rng: random.Random, blanks: int, size: int = 4) -> dict[str, Any] | None:
    """One puzzle with exactly ``blanks`` blank cells and a unique solution (None if this draw had
    more than one solution)."""
    solution = random_full_grid(rng, size)
    cells = rng.sample(range(len(solution)), blanks)
    puzzle = list(solution)
    for c in cells:
        puzzle[c] = "0"
    p = "".join(puzzle)
    if count_solutions(p, 2) != 1:
        return None
    return {"puzzle": p, "solution": solution}


def make_sudoku(
    n: int,
    seed: int = 0,
    *,
    blanks: int = 8,
    size: int = 4,
    split: str = "train",
    exclude: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """``n`` distinct sudoku puzzles with ``blanks`` blanks and unique solutions."""
    if size not in (4, 9):
        raise UserError(f"sudoku --size must be 4 or 9, got {size}")
    if not 1 <= blanks < size * size:
        raise UserError(f"sudoku --blanks must be in 1..{size * size - 1}, got {blanks}")
    rng = _rng("sudoku", split, seed)
    return _collect(
        "sudoku", n, lambda: random_sudoku(rng, blanks, size), set(exclude), max_tries=200 * n + 2000
    )


# ---------------------------------------------------------------------------------------------- arith
def random_arith(
    rng: random.Random, operands: int, digits: int, ops: Sequence[str] = "+-*"
) -> dict[str, Any]:
    """One expression of ``operands`` numbers with exactly ``digits`` digits each (1-digit numbers may
    be 0) and its integer value under the usual precedence."""
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    nums = [rng.randint(lo, 10**digits - 1) for _ in range(operands)]
    parts = [str(nums[0])]
    for v in nums[1:]:
        parts += [rng.choice(list(ops)), str(v)]
    expr = "".join(parts)
    return {"expression": expr, "answer": _eval_plus_minus_times(expr)}


def _eval_plus_minus_times(expr: str) -> int:
    """Value of an expression of non-negative integers with ``+ - *`` (multiplication first)."""
    total, term, sign, num = 0, 1, 1, ""
    pending_mul = False
    for ch in expr + "+":
        if ch.isdigit():
            num += ch
            continue
        v = int(num)
        num = ""
        term = term * v if pending_mul else v
        if ch == "*":
            pending_mul = True
            continue
        total += sign * term
        sign, pending_mul = (1 if ch == "+" else -1), False
    return total


def make_arith(
    n: int,
    seed: int = 0,
    *,
    operands: int = 3,
    digits: int = 2,
    ops: str = "+-*",
    split: str = "train",
    exclude: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """``n`` distinct arithmetic expressions (see module docstring for the knobs)."""
    if operands < 2 or digits < 1:
        raise UserError("arith needs --operands >= 2 and --digits >= 1")
    limit = sys.get_int_max_str_digits()  # Python's bound on int <-> text conversion (0: none)
    if limit and operands * digits > limit:  # a product of the operands has up to operands * digits digits
        raise UserError(f"arith --digits {digits} with --operands {operands}: an answer could have "
                        f"{operands * digits} digits, more than Python converts to text ({limit}); use --digits <= "
                        f"{limit // operands}")
    if not ops or set(ops) - set("+-*"):
        raise UserError(f"arith --ops must use only + - *, got {ops!r}")
    rng = _rng("arith", split, seed)
    return _collect(
        "arith", n, lambda: random_arith(rng, operands, digits, ops), set(exclude), max_tries=200 * n + 1000
    )


# --------------------------------------------------------------------------------------------- common
def make(
    kind: str,
    n: int,
    seed: int = 0,
    *,
    difficulty: str | None = None,
    split: str = "train",
    exclude: Iterable[str] = (),
    **knobs: Any,
) -> list[dict[str, Any]]:
    """Dispatch to a generator; ``difficulty`` picks a preset, explicit ``knobs`` override it."""
    if kind not in KINDS:
        raise UserError(f"unknown synthetic kind {kind!r}; choose one of {', '.join(KINDS)}")
    params: dict[str, Any] = {}
    if difficulty is not None:
        if difficulty not in DIFFICULTY[kind]:
            raise UserError(
                f"unknown difficulty {difficulty!r}; choose one of {', '.join(DIFFICULTY[kind])}"
            )
        params.update(DIFFICULTY[kind][difficulty])
    params.update({k: v for k, v in knobs.items() if v is not None})
    fn = {"countdown": make_countdown, "sudoku": make_sudoku, "arith": make_arith}[kind]
    return fn(n, seed, split=split, exclude=exclude, **params)


def make_split_pair(
    kind: str, n_train: int, n_test: int, seed: int = 0, **kwargs: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A train set and a test set with no row in common (the test set is made first and excluded)."""
    exclude = set(kwargs.pop("exclude", ()))
    test = make(kind, n_test, seed, split="test", exclude=exclude, **kwargs)
    train = make(
        kind, n_train, seed, split="train", exclude=exclude | {row_key(kind, r) for r in test}, **kwargs
    )
    return train, test
