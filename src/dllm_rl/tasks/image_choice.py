"""Multiple choice over an image (SEED-Bench style): options A-D in the prompt, the option letter as the answer.

Data: ``question``, the image(s) (``image`` / ``images``, see :mod:`dllm_rl.tasks.image_task`), the options and
``answer``. Options come from the first of: an ``options`` / ``choices`` list; columns ``choice_a``,
``choice_b``, ... (SEED-Bench on the hub); columns ``A``, ``B``, ... (MMBench); 2 to 8 options, taken in order
until the first missing one. ``answer`` is the correct option's letter (``"B"``, ``"(b)"``) or its 0-based
index. Default data: ``hf:lmms-lab/SEED-Bench@test``.

Prompt (LLaVA's published multiple-choice prompt)::

    <image>
    What is on the table?
    A. a cup
    B. a book
    Answer with the option's letter from the given choices directly.

Answer extraction (:func:`extract_choice`; first rule that finds a letter wins):

1. the last ``<answer>...</answer>``, then the last ``\\boxed{...}``, when its content is one option letter
   (``B``, ``(B)``, ``B.``, ``B) a book``; lowercase accepted there);
2. the last "answer is B" / "answer: (B)" / "answer is option B";
3. the whole completion, else its last non-empty line, when it starts with an option letter alone: ``B``,
   ``(B)``, ``B.``, ``B)``, ``B:`` (``B. a book``); an article such as "A cup ..." is not a letter.

Reward: 1.0 when the letter is the right option, else 0.0 (a letter past the last option scores 0).
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import DataError, Score
from .extract import last_boxed, tagged
from .image_task import ImageTask

LETTERS = string.ascii_uppercase[:8]
INSTRUCTION = "Answer with the option's letter from the given choices directly."
_LEAD = r"(?:\(([A-H])\)|([A-H])(?=[.:)]|$))"
_LETTER = re.compile(_LEAD)
_LETTER_ANY_CASE = re.compile(_LEAD, re.IGNORECASE)
_ANSWER_IS = re.compile(r"(?i:answer(?:\s+is|\s*:))\s*(?i:option\s*)?(?:\(([A-H])\)|([A-H])(?![A-Za-z]))")


def _letter_alone(text: str, lowercase: bool) -> str | None:
    """The option letter a short answer starts with (``B``, ``(B)``, ``B.``, ``B) a book``), else None; with
    ``lowercase``, ``b`` and ``(b)`` count too."""
    m = (_LETTER_ANY_CASE if lowercase else _LETTER).match(text.strip())
    return None if m is None else (m.group(1) or m.group(2)).upper()


def extract_choice(text: str) -> str | None:
    """The option letter a completion gives, by the rules in the module docstring (None when it gives none)."""
    for inner in (tagged(text), last_boxed(text)[0]):
        if inner is not None and (letter := _letter_alone(inner, lowercase=True)) is not None:
            return letter
    last = None
    for m in _ANSWER_IS.finditer(text[-10000:]):
        last = m
    if last is not None:
        return last.group(1) or last.group(2)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    for candidate in (text, lines[-1] if lines else ""):
        if (letter := _letter_alone(candidate, lowercase=False)) is not None:
            return letter
    return None


def _option_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if value.strip().startswith("[") else None
        except (ValueError, SyntaxError):
            value = None
        if value is None:
            raise DataError(f"{where}: field 'options' must be a list of option texts")
    return list(value)


def options_of(row: Mapping[str, Any], where: str) -> list[str]:
    """The option texts of a row, in letter order (see the module docstring); DataError unless 2 to 8."""
    opts: list[Any] = []
    for key in ("options", "choices"):
        if row.get(key) is not None:
            opts = _option_list(row[key], where)
            break
    else:
        for names in ([f"choice_{c}" for c in LETTERS.lower()], list(LETTERS)):
            for name in names:
                if row.get(name) is None or str(row[name]).strip() in ("", "nan"):
                    break
                opts.append(row[name])
            if opts:
                break
    if not 2 <= len(opts) <= len(LETTERS):
        raise DataError(f"{where}: need 2 to {len(LETTERS)} options ('options' list, 'choice_a'.. or 'A'.. "
                        f"columns), found {len(opts)}")
    return [str(o).strip() for o in opts]


def answer_letter(value: Any, n_options: int, where: str) -> str:
    """The correct option's letter from ``answer`` (a letter or a 0-based index); DataError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        letter = LETTERS[value] if 0 <= value < len(LETTERS) else None
    else:
        letter = _letter_alone(str(value), lowercase=True) if len(str(value).strip()) <= 4 else None
    if letter is None or LETTERS.index(letter) >= n_options:
        raise DataError(f"{where}: field 'answer' must be an option letter A-{LETTERS[n_options - 1]} or a 0-based "
                        f"index, got {str(value)[:40]!r}")
    return letter


class ImageChoiceTask(ImageTask):
    """Multiple-choice questions over images, letter reward (see module docstring)."""

    name: ClassVar[str] = "image_choice"
    required_fields: ClassVar = (("question", "problem", "prompt"), ("answer",))
    hub_datasets: ClassVar = {"test": "hf:lmms-lab/SEED-Bench@test"}

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """Add ``options`` (the option texts) and ``answer_letter``."""
        row["options"] = options_of(row, where)
        row["answer_letter"] = answer_letter(row["answer"], len(row["options"]), where)
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """The question, one ``X. option`` line per option, and the answer-with-a-letter instruction."""
        q = example.get("question") or example.get("problem") or example.get("prompt")
        lines = [f"{LETTERS[i]}. {opt}" for i, opt in enumerate(example["options"])]
        return "\n".join([str(q).strip(), *lines, INSTRUCTION])

    def extract_answer(self, text: str) -> str | None:
        """See :func:`extract_choice`."""
        return extract_choice(text)

    def reference_completion(self, example: Mapping[str, Any]) -> str:
        """The right letter alone, as the instruction asks."""
        return str(example["answer_letter"])

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        gold = example.get("answer_letter") or answer_letter(example["answer"], len(example["options"]), "example")
        got = extract_choice(text)
        if got is None:
            return Score(0.0, "no option letter (e.g. 'B', '(B)', 'The answer is B', <answer>B</answer>)")
        n = len(example["options"])
        if LETTERS.index(got) >= n:
            return Score(0.0, f"no option {got} ({n} options)")
        if got == gold:
            return Score(1.0, f"correct: {got}")
        return Score(0.0, f"wrong: got {got}, expected {gold}")
