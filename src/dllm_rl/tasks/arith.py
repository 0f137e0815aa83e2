"""Arithmetic: evaluate an integer expression (synthetic; made by ``dllm-rl data make arith``).

Data: ``expression`` (e.g. ``"12+34*5"``; ``+ - *`` with Python precedence) and ``answer`` (an int).
No default file: generate one, or pass ``data=[...]`` rows.

Prompt styles:
- ``compact``: ``"calc 12+34*5\\n"`` -> completion ``"<answer>182</answer>"``.
- ``chat`` / ``plain``: an English instruction asking for the value inside ``<answer></answer>``.

Answer extraction: the last ``<answer>...</answer>`` (``strict=True``, default); ``strict=False`` falls
back to the last integer in the completion. Reward: 1.0 when that text is exactly one integer (spaces
and thousands commas allowed) equal to ``answer``, else 0.0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import DataError, Score, Task
from .countdown import ExpressionError, evaluate_expression
from .extract import tagged

_INT = re.compile(r"-?\d+")


def parse_int(text: str) -> int | None:
    """The integer a short answer string denotes (``" 1,234 "`` -> 1234), or None if it is not one."""
    s = text.strip().replace(",", "").replace(" ", "").replace("\u2212", "-")
    if len(s) > 100 or not re.fullmatch(r"-?\d+", s):
        return None
    return int(s)


class ArithTask(Task):
    """Integer arithmetic with an exact-match reward (see module docstring)."""

    name: ClassVar[str] = "arith"
    required_fields: ClassVar = (("expression", "question"), ("answer",))
    prompt_styles: ClassVar = ("chat", "plain", "compact")

    def __init__(self, data: Any = None, *, strict: bool = True, **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self.strict = strict

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Parse ``answer`` as an int (DataError otherwise); keep ``expression``."""
        row["expression"] = str(row.get("expression", row.get("question"))).strip()
        value = parse_int(str(row["answer"]))
        if value is None:
            raise DataError(f"{where}: field 'answer' must be an integer, got {str(row['answer'])[:40]!r}")
        row["answer"] = value
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """``calc <expr>\\n`` (compact) or an English instruction with the <answer> format."""
        if self.prompt_style == "compact":
            return f"calc {example['expression']}\n"
        return (
            f"Compute {example['expression']} (usual operator precedence). Give only the final integer "
            "inside <answer> </answer> tags, for example <answer>42</answer>."
        )

    def extract_answer(self, text: str) -> str | None:
        """Last ``<answer>`` content; non-strict: else the last integer in the text."""
        ans = tagged(text)
        if ans is None and not self.strict:
            last = None
            for m in _INT.finditer(text[-10000:]):
                last = m
            ans = last.group() if last else None
        return ans

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """``<answer>{answer}</answer>``."""
        return f"<answer>{example['answer']}</answer>"

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        gold = int(example["answer"])
        ans = self.extract_answer(text)
        if ans is None:
            return Score(0.0, "no <answer>...</answer>" if self.strict else "no integer in the answer")
        value = parse_int(ans)
        if value is None:
            return Score(0.0, f"answer is not an integer: {ans[:40]!r}")
        if value == gold:
            return Score(1.0, f"correct: {value}")
        return Score(0.0, f"wrong: got {value}, expected {gold}")


def evaluate_arith(expression: str) -> int:
    """The exact integer value of a synthetic arithmetic expression (safe AST evaluation)."""
    try:
        value, _ = evaluate_expression(expression)
    except ExpressionError as exc:
        raise ValueError(str(exc)) from exc
    if value.denominator != 1:
        raise ValueError(f"{expression!r} is not an integer expression")
    return int(value)
