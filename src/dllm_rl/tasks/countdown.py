"""Countdown: combine the given numbers with + - * / to reach a target.

Data: ``nums`` (list of ints) / ``input`` (``"30,100,93"``, the d1 / ESPO format) and ``target`` /
``output``; optionally ``solution`` (a reference expression, written by the synthetic generator).
Default file: ``countdown/cd3_test.jsonl`` (3 numbers, split ``test``).

Prompt styles:
- ``compact`` (for character-level tiny models): ``"nums 3 5 7 target 22\\n"``; the expected
  completion is ``"<answer>3*5+7</answer>"``.
- ``chat`` / ``plain``: an English instruction asking for the expression inside ``<answer></answer>``.

Answer extraction: the content of the last ``<answer>...</answer>``. With ``strict=True`` (default) the
tags are required; ``strict=False`` also accepts an unclosed ``<answer>`` or, with no tag at all, the
last non-empty line. A trailing ``= value`` is dropped (only the left side is evaluated).

Reward: 1.0 when the expression (a) parses as arithmetic only - integer literals, binary ``+ - * /``
and parentheses, checked by walking the ``ast`` (never ``eval``); (b) uses each given number exactly
once (as a multiset); (c) evaluates exactly (fractions, so ``/`` is true division) to the target.
Otherwise 0.0 with the reason.
"""

from __future__ import annotations

import ast
import itertools
import operator
import random
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, ClassVar

from .base import DataError, Score, Task
from .extract import after_open_tag, tagged

MAX_EXPR_CHARS = 300
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """An answer expression that is not allowed arithmetic (the message is the reward reason)."""


def evaluate_expression(expr: str) -> tuple[Fraction, list[int]]:
    """Evaluate an arithmetic expression safely: returns its exact value and the integer literals it uses.

    Allowed: non-negative integer literals, binary ``+ - * /``, parentheses. Anything else (names, calls,
    unary minus, ``**``, floats, ...) raises :class:`ExpressionError`; so does division by zero.
    """
    if len(expr) > MAX_EXPR_CHARS:
        raise ExpressionError(f"expression too long ({len(expr)} chars)")
    expr = expr.replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-").strip()
    if not expr:
        raise ExpressionError("empty expression")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(f"not an arithmetic expression: {expr[:60]!r}") from exc
    used: list[int] = []

    def walk(node: ast.AST, depth: int) -> Fraction:
        if depth > 100:
            raise ExpressionError("expression nested too deeply")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left, depth + 1), walk(node.right, depth + 1)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ExpressionError("division by zero")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            used.append(node.value)
            return Fraction(node.value)
        what = type(node.op).__name__ if isinstance(node, ast.BinOp | ast.UnaryOp) else type(node).__name__
        raise ExpressionError(f"disallowed syntax: {what}")

    try:
        value = walk(tree.body, 0)
    except RecursionError as exc:
        raise ExpressionError("expression nested too deeply") from exc
    return value, used


def check_countdown(expr: str, nums: Sequence[int], target: int | Fraction) -> tuple[bool, str]:
    """Countdown rule: ``expr`` uses each of ``nums`` exactly once and equals ``target``."""
    try:
        value, used = evaluate_expression(expr)
    except ExpressionError as exc:
        return False, str(exc)
    if sorted(used) != sorted(int(n) for n in nums):
        return False, f"numbers used {sorted(used)} != given {sorted(int(n) for n in nums)}"
    if value != target:
        shown = value.numerator if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return False, f"expression equals {shown}, target {target}"
    return True, "correct"


def solve_countdown(nums: Sequence[int], target: int, rng: random.Random | None = None) -> str | None:
    """An expression reaching ``target`` with each number used once (exhaustive search), or None.

    Searches all ways to combine two remaining values with ``+ - * /`` (exact fractions), memoizing
    reached states; fine for up to ~6 numbers. ``rng`` randomizes which solution is returned.
    """
    goal = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        key = tuple(sorted(v for v, _ in items))
        if key in seen:
            return None
        seen.add(key)
        pairs = list(itertools.combinations(range(len(items)), 2))
        if rng is not None:
            rng.shuffle(pairs)
        for i, j in pairs:
            (a, ea), (b, eb) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            last = not rest
            cands = [
                (a + b, f"{ea}+{eb}"),
                (a * b, f"{_wrap(ea, '*')}*{_wrap(eb, '*')}"),
                (a - b, f"{ea}-{_wrap(eb, '-')}"),
                (b - a, f"{eb}-{_wrap(ea, '-')}"),
            ]
            if b != 0:
                cands.append((a / b, f"{_wrap(ea, '/')}/{_wrap(eb, '/', right=True)}"))
            if a != 0:
                cands.append((b / a, f"{_wrap(eb, '/')}/{_wrap(ea, '/', right=True)}"))
            for value, text in cands:
                if last and value != goal:
                    continue
                found = search(rest + [(value, text)])
                if found is not None:
                    return found
        return None

    return search([(Fraction(n), str(n)) for n in nums])


def _wrap(expr: str, op: str, right: bool = False) -> str:
    """Parenthesize a sub-expression where precedence requires it."""
    if expr.isdigit():
        return expr
    depth, top = 0, set()
    for ch in expr:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and ch in "+-*/":
            top.add(ch)
    if op in "*/" and top & {"+", "-"}:
        return f"({expr})"
    if op == "-" and top & {"+", "-"}:
        return f"({expr})"
    if op == "/" and (right or top & {"+", "-"}) and top:
        return f"({expr})"
    return expr


def parse_numbers(value: Any, where: str) -> list[int]:
    """The numbers of a row: a list of ints, or a string like ``"30,100,93"`` / ``"30 100 93"``."""
    try:
        if isinstance(value, str):
            parts = value.replace(",", " ").split()
            return [int(p) for p in parts]
        return [int(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: field 'nums'/'input' must be integers, got {str(value)[:60]!r}") from exc


class CountdownTask(Task):
    """Countdown arithmetic puzzles (see module docstring). Extra arg: ``strict`` (require the tags)."""

    name: ClassVar[str] = "countdown"
    required_fields: ClassVar = (("nums", "input", "numbers"), ("target", "output"))
    default_files: ClassVar = {"test": "countdown/cd3_test.jsonl"}  # bundled (d1 / ESPO's cd3 test set)
    hub_datasets: ClassVar = {"train": "hf:Jiayi-Pan/Countdown-Tasks-3to4@train"}  # TinyZero's, as d1 trains on
    prompt_styles: ClassVar = ("chat", "plain", "compact")

    def __init__(self, data: Any = None, *, strict: bool = True, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.strict = strict

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Parse ``nums`` (list or ``"a,b,c"``) and ``target`` as ints."""
        raw = row.get("nums", row.get("input", row.get("numbers")))
        row["nums"] = parse_numbers(raw, where)
        if not row["nums"]:
            raise DataError(f"{where}: no numbers given")
        try:
            row["target"] = int(str(row.get("target", row.get("output"))).strip())
        except ValueError as exc:
            raise DataError(f"{where}: field 'target'/'output' must be an integer") from exc
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """``nums 3 5 7 target 22\\n`` (compact) or an English instruction."""
        nums, target = example["nums"], example["target"]
        if self.prompt_style == "compact":
            return f"nums {' '.join(map(str, nums))} target {target}\n"
        return (
            f"Using the numbers {list(nums)}, create an equation that equals {target}. You can use basic "
            "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your "
            "reasoning, then give only the expression inside <answer> </answer> tags, for example "
            "<answer>(1 + 2) / 3</answer>."
        )

    def extract_answer(self, text: str) -> str | None:
        """Last ``<answer>`` content (see ``strict``), left of any ``=``."""
        ans = tagged(text)
        if ans is None and not self.strict:
            ans = after_open_tag(text)
            if ans is None:
                lines = [ln for ln in text.strip().splitlines() if ln.strip()]
                ans = lines[-1] if lines else None
        if ans is not None and "=" in ans:
            ans = ans.split("=", 1)[0]
        return ans.strip() if ans is not None else None

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """``<answer>{solution}</answer>``, solving the puzzle if no solution is stored."""
        sol = example.get("solution") or solve_countdown(example["nums"], int(example["target"]))
        return None if sol is None else f"<answer>{sol}</answer>"

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        nums = example.get("nums", example.get("input", example.get("numbers")))
        target = example.get("target", example.get("output"))
        nums_l = parse_numbers(nums, "example")
        target_i = int(str(target).strip())
        expr = self.extract_answer(text)
        if expr is None:
            return Score(0.0, "no <answer>...</answer>" if self.strict else "no answer")
        ok, why = check_countdown(expr, nums_l, target_i)
        return Score(1.0 if ok else 0.0, why)
