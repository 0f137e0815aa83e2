"""GSM8K: grade-school math word problems with a numeric final answer.

Data: ``question`` and ``answer`` (a worked solution ending in ``#### <number>``); the task adds
``final_answer`` (the text after the last ``####``). Default files: ``gsm8k/{train,test}.jsonl``.

Answer extraction (first rule that finds something wins; within a rule the *last* occurrence):
1. the last complete ``\\boxed{...}``;
2. the last ``#### x`` (rest of that line);
3. the last "The (final) answer is x" (rest of that line).

Reward: 1.0 when the first number of the extracted text (see :func:`extract.parse_number`: commas,
``$``, units, ``%`` and trailing ``.0`` are ignored; fractions are exact) equals the reference
number, else 0.0. Reasons: ``correct``, ``wrong: got X, expected Y``, ``no final answer ...``,
``unbalanced \\boxed{``, ``answer too long`` (an extracted answer over
:data:`~dllm_rl.tasks.extract.MAX_ANSWER_CHARS` characters is not parsed), ``no number in answer``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import DataError, Score, Task
from .extract import format_number, last_boxed, parse_number, too_long_reason

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"answer is[ \t:]*([^\n]*)", re.IGNORECASE)
_CALC = re.compile(r"<<[^<>]*>>")


def reference_answer(answer: str) -> str:
    """The reference number of a GSM8K ``answer`` field: the text after its last ``####`` (or the
    whole field when it has none)."""
    return answer.rsplit("####", 1)[1].strip() if "####" in answer else answer.strip()


def extract_gsm8k_answer(text: str) -> tuple[str | None, str]:
    """The final-answer text of a completion and a status (``"ok"``, ``"unbalanced"`` or
    ``"missing"``), by the rules in the module docstring."""
    boxed, status = last_boxed(text)
    if boxed is not None:
        return boxed, "ok"
    last = None
    for m in _HASHES.finditer(text):
        last = m
    if last is None:
        for m in _ANSWER_IS.finditer(text):
            last = m
    if last is not None:
        return last.group(1), "ok"
    return None, status


class GSM8KTask(Task):
    """GSM8K word problems, numeric reward (see module docstring)."""

    name: ClassVar[str] = "gsm8k"
    required_fields: ClassVar = (("question", "problem", "prompt"), ("final_answer", "answer"))
    default_files: ClassVar = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}
    hub_datasets: ClassVar = {"train": "hf:openai/gsm8k:main@train", "test": "hf:openai/gsm8k:main@test"}
    instruction: ClassVar[str] = "Please reason step by step, and put your final answer within \\boxed{}."

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Add ``final_answer`` (text after the last ``####``); it must contain a number."""
        if row.get("final_answer") is None:
            row["final_answer"] = reference_answer(str(row["answer"]))
        row["final_answer"] = str(row["final_answer"]).strip()
        if parse_number(row["final_answer"]) is None:
            raise DataError(
                f"{where}: field 'answer' has no number after '####' "
                f"(got {str(row.get('answer', row['final_answer']))[-60:]!r})"
            )
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """The question followed by the boxed-answer instruction."""
        q = example.get("question") or example.get("problem") or example.get("prompt")
        return f"{str(q).strip()}\n{self.instruction}"

    def extract_answer(self, text: str) -> str | None:
        """See :func:`extract_gsm8k_answer`."""
        return extract_gsm8k_answer(text)[0]

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """The worked solution without ``<<calc>>`` annotations (ends in ``#### x``)."""
        if example.get("answer") and "####" in str(example["answer"]):
            return _CALC.sub("", str(example["answer"]))
        return f"The answer is \\boxed{{{example['final_answer']}}}."

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        gold_text = example.get("final_answer")
        if gold_text is None:
            gold_text = reference_answer(str(example.get("answer", "")))
        gold = parse_number(str(gold_text))
        if gold is None:
            return Score(0.0, f"bad reference answer {str(gold_text)[:40]!r}")
        found, status = extract_gsm8k_answer(text)
        if found is None:
            if status == "unbalanced":
                return Score(0.0, "unbalanced \\boxed{ (never closed)")
            return Score(0.0, "no final answer (\\boxed{x}, '#### x' or 'The answer is x')")
        too_long = too_long_reason(found)
        if too_long:
            return Score(0.0, too_long)
        pred = parse_number(found)
        if pred is None:
            return Score(0.0, f"no number in answer {found[:40]!r}")
        if pred == gold:
            return Score(1.0, f"correct: {format_number(pred)}")
        return Score(0.0, f"wrong: got {format_number(pred)}, expected {format_number(gold)}")
