"""Answer extraction shared by the tasks. Every function is linear in the text length (no regex that can
backtrack quadratically), so megabyte-long or adversarial completions are cheap to reject."""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def boxed_contents(text: str) -> tuple[list[str], bool]:
    """All complete ``\\boxed{...}`` (and ``\\fbox{...}``) contents in order, with nested braces
    balanced, and whether an opened ``\\boxed{`` was left unclosed."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return [], False
    found: list[tuple[int, str]] = []
    stack: list[int | None] = []  # for each open brace: start index of box content, or None
    for m in _BOX_TOKENS.finditer(text):
        tok = m.group()
        if tok == "}":
            if stack:
                start = stack.pop()
                if start is not None:
                    found.append((start, text[start : m.start()]))
        else:
            stack.append(m.end() if tok != "{" else None)
    unclosed = any(s is not None for s in stack)
    found.sort()
    return [c for _, c in found], unclosed


def last_boxed(text: str) -> tuple[str | None, str]:
    """The content of the last complete ``\\boxed{}`` and a status: ``"ok"``, ``"unbalanced"`` (a
    ``\\boxed{`` was opened but never closed and no complete one exists) or ``"missing"``."""
    contents, unclosed = boxed_contents(text)
    if contents:
        return contents[-1], "ok"
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


def parse_number(text: str, max_len: int = 1000) -> Fraction | None:
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
    f = float(x)
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
