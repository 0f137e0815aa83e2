"""Answer extraction shared by the tasks. Every function is linear in the text length, in time and in
memory (no regex that can backtrack quadratically, no substring copied per nesting level), so
megabyte-long or adversarial completions are cheap to reject.

:data:`MAX_ANSWER_CHARS` is the longest extracted answer a reward hands to a parser or verifier; the
tasks score a longer answer 0 with the reason :func:`too_long_reason` gives, without parsing it."""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 1000
"""Longest extracted answer (characters) a reward parses or verifies; longer ones score 0."""

_BOX_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def too_long_reason(answer: str, limit: int = MAX_ANSWER_CHARS) -> str | None:
    """The 0-score reason for an extracted answer longer than ``limit`` characters (None when it fits)."""
    if len(answer) <= limit:
        return None
    return f"answer too long ({len(answer)} chars, max {limit})"


def boxed_spans(text: str) -> tuple[list[tuple[int, int]], bool]:
    """``(start, end)`` of every complete ``\\boxed{...}`` (and ``\\fbox{...}``) content, nested braces
    balanced, ordered by start (``text[start:end]`` is the content), and whether an opened ``\\boxed{``
    was left unclosed.

    One pass over the brace tokens with a stack of open-brace positions; only indices are stored, so
    time and memory are linear in ``len(text)`` even for deeply nested boxes (a nesting bomb).
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return [], False
    starts: list[int] = []  # per opened box, in opening order: where its content starts
    ends: list[int] = []  # ... and where it ends (-1 while open)
    stack: list[int] = []  # per open brace: its box's slot in starts/ends, or -1 for a plain brace
    for m in _BOX_TOKENS.finditer(text):
        tok = m.group()
        if tok == "}":
            if stack:
                slot = stack.pop()
                if slot >= 0:
                    ends[slot] = m.start()
        elif tok == "{":
            stack.append(-1)
        else:
            stack.append(len(starts))
            starts.append(m.end())
            ends.append(-1)
    spans = [(s, e) for s, e in zip(starts, ends) if e >= 0]
    return spans, len(spans) < len(starts)


def last_boxed(text: str) -> tuple[str | None, str]:
    """The content of the last complete ``\\boxed{}`` (the one that starts last) and a status: ``"ok"``,
    ``"unbalanced"`` (a ``\\boxed{`` was opened but never closed and no complete one exists) or
    ``"missing"``. Only that one content is copied out of ``text``."""
    spans, unclosed = boxed_spans(text)
    if spans:
        start, end = spans[-1]
        return text[start:end], "ok"
    return None, "unbalanced" if unclosed else "missing"


def tagged(text: str, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>...</tag>`` pair (None when there is none)."""
    close = f"</{tag}>"
    end = text.rfind(close)
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    if start < 0:
        return None
    return text[start + len(tag) + 2 : end]


def after_open_tag(text: str, tag: str = "answer") -> str | None:
    """Text after the last ``<tag>`` when it is never closed (lenient extraction)."""
    start = text.rfind(f"<{tag}>")
    return None if start < 0 else text[start + len(tag) + 2 :]


_LATEX_NOISE = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle)\b|\$|\\\$")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(-?\d+(?:\.\d+)?)\s*\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+")


def parse_number(text: str, max_len: int = MAX_ANSWER_CHARS) -> Fraction | None:
    """The first number in an answer string, as an exact Fraction.

    Rule: drop LaTeX spacing / ``$`` / ``\\left`` / ``\\text{}`` wrappers and thousands separators
    (``1,000``), keep only what follows the last ``=``, then read the first integer, decimal
    (``18.00``, ``.5``), simple fraction (``3/4``) or ``\\frac{a}{b}``; trailing units or ``%`` are
    ignored. Returns None when there is no number (or the string is longer than ``max_len``).
    """
    if len(text) > max_len:
        return None
    s = _TEXT_WRAP.sub(r" \1 ", text)
    s = _LATEX_NOISE.sub(" ", s)
    s = _FRAC.sub(r"\1/\2", s)
    s = _THOUSANDS.sub("", s)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    m = _NUMBER.search(s.replace("\u2212", "-"))
    if not m:
        return None
    token = m.group().replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            if Fraction(den) == 0:
                return None
            return Fraction(num) / Fraction(den)
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(x: Fraction) -> str:
    """A Fraction as a short string: ``18``, ``-2.5`` or ``1/3``."""
    if x.denominator == 1:
        return str(x.numerator)
    try:
        f = float(x)
    except OverflowError:  # a fraction of two long literals
        return f"{x.numerator}/{x.denominator}"
    return repr(f) if Fraction(f) == x else f"{x.numerator}/{x.denominator}"


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n")


def code_blocks(text: str) -> list[str]:
    """Contents of fenced code blocks (```lang ... ```); an unclosed last fence runs to the end."""
    blocks: list[str] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if not m:
            break
        end = text.find("```", m.end())
        if end < 0:
            blocks.append(text[m.end() :])
            break
        blocks.append(text[m.end() : end])
        pos = end + 3
    return blocks
