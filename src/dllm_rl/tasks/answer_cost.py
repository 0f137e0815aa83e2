"""A static bound on what evaluating a short math answer costs, checked before math-verify sees it.

sympy evaluates integer powers and factorials eagerly, so a 15-character answer such as
``9^{9^{9^{9}}}``, ``(9^9)!`` or ``\\binom{10^6}{5\\cdot 10^5}`` never finishes parsing, and
``(x+y+z+w)^{25}`` never finishes simplifying. :func:`evaluation_risk` reads the answer text once
(LaTeX or plain ``**``), computes for every sub-expression an upper bound on

- its magnitude, as a number of decimal digits ``M`` (``log10`` of the largest value it can take), and
- the number of monomials ``T`` it would expand to,

and rejects the answer when any bound passes :data:`MAX_DIGITS`, :data:`MAX_TERMS`, or when it is
nested deeper than :data:`MAX_DEPTH` or has more than :data:`MAX_ATOMS` literals and symbols (the
parse time of math-verify itself grows fast in both). Rules (all atoms count as at least 2, so
``a + b <= a * b`` holds):

- a literal: ``log10`` of its value, at least its count of decimals (``0.001`` divides by 10^3), plus
  the size of a scientific exponent (``1e-5``, ``1e300000000``);
  a letter or command (``x``, ``\\pi``, ``\\circ``): magnitude 10, one symbolic term;
- ``a + b``, ``a - b``, ``a * b``, ``a / b``, ``\\frac{a}{b}``, juxtaposition: ``M = M(a) + M(b)``;
  ``T`` adds for sums, multiplies for products;
- ``a ^ b`` / ``a ** b``: ``M = M(a) * 10^M(b)``; a symbolic base of ``T(a)`` terms to a numeric
  power ``n`` expands to ``C(n + T(a) - 1, T(a) - 1)`` terms;
- ``n!``, ``\\Gamma(n)``: ``M = n log10 n`` with ``n = 10^M(n)``; ``\\binom{n}{k}``: ``M = n``.

Unknown characters separate terms; missing operands count as 2. The check is a heuristic upper
bound, not a parser: it only has to be cheap (linear in the text) and generous to real answers (every
GSM8K and MATH-500 reference answer passes).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

MAX_DIGITS = 20_000
"""Largest number (in decimal digits) an answer may build; sympy handles this size in milliseconds."""
MAX_TERMS = 100
"""Most monomials a symbolic answer may expand to; ``(x+1)^{99}`` is the largest binomial power."""
MAX_DEPTH = 5
"""Deepest nesting of brackets and exponents an answer may have (MATH-500 answers nest 3 levels;
math-verify's parse time grows about 1.5x per level of bare braces)."""
MAX_ATOMS = 60
"""Most literals and symbols an answer may have (MATH-500 answers have at most 24; math-verify's time
grows faster than linearly in them: 80 subscripted symbols take over a second)."""

_TOKEN = re.compile(
    r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)|(?P<pow>\^|\*\*)|(?P<cmd>\\[A-Za-z]+|\\.)|(?P<open>[{(\[])"
    r"|(?P<close>[})\]])|(?P<bang>!)|(?P<mul>[*/\u00d7\u00f7\u00b7])|(?P<sub>_)|(?P<sym>[^\W\d_])|(?P<sep>\S)",
    re.DOTALL,
)
_SKIP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
         "textstyle", "limits", "quad", "qquad", "text", "textbf", "mathrm", "mbox", "operatorname",
         "!", ",", ";", ":", " ", "$"}  # fmt: skip
_MUL = {"cdot", "times", "div", "ast"}
_TWO_ARGS = {"frac", "dfrac", "tfrac", "cfrac"}
_BINOM = {"binom", "dbinom", "tbinom"}
_FACTORIAL = {"Gamma", "factorial"}
_LOG2 = math.log10(2)


class _Reject(Exception):
    """Raised inside the walk with the 0-score reason."""


class _Bound(NamedTuple):
    digits: float  # upper bound on log10 |value| (and log10 1/|value|)
    terms: float  # upper bound on the monomials after expansion
    symbolic: bool


_TWO = _Bound(_LOG2, 1.0, False)
_SYMBOL = _Bound(1.0, 1.0, True)


def _value(b: _Bound) -> float:
    """Upper bound on the value itself (``10^digits``; inf past float range)."""
    return math.inf if b.digits > 300 else 10.0**b.digits


def _literal(text: str) -> _Bound:
    text, _, exp = text.lower().partition("e")
    whole, _, frac = text.partition(".")
    whole = whole.lstrip("0")
    if len(whole) > 15:
        digits = float(len(whole))
    else:
        digits = math.log10(float(text)) if float(text) >= 1 else 0.0
    return _Bound(max(digits, float(len(frac)), _LOG2) + (abs(int(exp[:30])) if exp else 0), 1.0, False)


def _checked(b: _Bound) -> _Bound:
    if b.digits > MAX_DIGITS:
        raise _Reject(f"it builds a number of about {b.digits:.3g} digits (max {MAX_DIGITS})")
    if b.terms > MAX_TERMS:
        raise _Reject(f"it expands to about {b.terms:.3g} terms (max {MAX_TERMS})")
    return b


def _product(a: _Bound, b: _Bound) -> _Bound:
    return _checked(_Bound(a.digits + b.digits, a.terms * b.terms, a.symbolic or b.symbolic))


def _sum(a: _Bound, b: _Bound) -> _Bound:
    symbolic = a.symbolic or b.symbolic
    return _checked(_Bound(a.digits + b.digits, a.terms + b.terms if symbolic else 1.0, symbolic))


def _power(base: _Bound, exp: _Bound) -> _Bound:
    n = _value(exp)
    digits = base.digits * n if n != math.inf else math.inf
    terms = 1.0 if base.terms <= 1 or exp.symbolic else _choose(n + base.terms - 1, base.terms - 1)
    return _checked(_Bound(digits, terms * (exp.terms if exp.symbolic else 1.0), base.symbolic or exp.symbolic))


def _choose(n: float, k: float) -> float:
    if n == math.inf:
        return math.inf
    log = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return math.inf if log > 700 else math.exp(log)


def _factorial(arg: _Bound) -> _Bound:
    n = _value(arg)
    digits = n * math.log10(n) if n != math.inf else math.inf
    return _checked(_Bound(max(digits, _LOG2), arg.terms, arg.symbolic))


class _Walk:
    """Recursive descent over the tokens: expr = term (sep term)*, term = factor (mul? factor)*,
    factor = postfix (pow factor)?, postfix = primary (! | _primary)*."""

    def __init__(self, text: str) -> None:
        self.toks = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]
        self.i = 0
        self.atoms = 0

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def expr(self, depth: int) -> _Bound:
        if depth > MAX_DEPTH:
            raise _Reject(f"it is nested more than {MAX_DEPTH} levels deep")
        out: _Bound | None = None
        while self.peek() not in (None, "close"):
            if self.peek() == "sep":
                self.i += 1
                continue
            t = self.term(depth)
            out = t if out is None else _sum(out, t)
        return out or _TWO

    def term(self, depth: int) -> _Bound:
        out: _Bound | None = None
        while self.peek() not in (None, "close", "sep"):
            if self.peek() == "mul":
                self.i += 1
                continue
            f = self.factor(depth)
            out = f if out is None else _product(out, f)
        return out or _TWO

    def factor(self, depth: int) -> _Bound:
        if depth > MAX_DEPTH:
            raise _Reject(f"it is nested more than {MAX_DEPTH} levels deep")
        base = self.postfix(depth)
        if self.peek() != "pow":
            return base
        self.i += 1  # an exponent nests one level (its braces, if any, are that level)
        return _power(base, self.factor(depth if self.peek() == "open" else depth + 1))

    def postfix(self, depth: int) -> _Bound:
        out = self.primary(depth)
        while self.peek() in ("bang", "sub"):
            kind = self.toks[self.i][0]
            self.i += 1
            if kind == "bang":
                out = _factorial(out)
            else:
                self.primary(depth)  # a subscript only names a symbol, but must be checked too
        return out

    def primary(self, depth: int) -> _Bound:
        kind = self.peek()
        if kind not in ("num", "sym", "cmd", "open"):
            return _TWO  # a missing operand (the caller consumes the operator)
        text = self.toks[self.i][1]
        self.i += 1
        if kind != "open":
            self.atoms += 1
            if self.atoms > MAX_ATOMS:
                raise _Reject(f"it has more than {MAX_ATOMS} numbers and symbols")
        if kind == "num":
            return _checked(_literal(text))
        if kind == "sym":
            return _SYMBOL
        if kind == "open":
            inner = self.expr(depth + 1)
            if self.peek() == "close":
                self.i += 1
            return inner
        return self.command(text[1:], depth)

    def command(self, name: str, depth: int) -> _Bound:
        if name in _SKIP or name in _MUL:
            return self.primary(depth) if self.peek() in ("num", "sym", "cmd", "open") else _TWO
        if name in _TWO_ARGS:
            return _product(self.primary(depth), self.primary(depth))
        if name in _BINOM:
            n, k = self.primary(depth), self.primary(depth)
            return _checked(_Bound(max(_value(n), _LOG2), n.terms * k.terms, n.symbolic or k.symbolic))
        if name in _FACTORIAL:
            return _factorial(self.primary(depth))
        return _SYMBOL


def evaluation_risk(answer: str) -> str | None:
    """Why evaluating ``answer`` (LaTeX or ``**`` notation) could not finish in time, or None when it
    is cheap; the rules and bounds are in the module docstring. Linear in ``len(answer)``."""
    walk = _Walk(answer)
    try:
        while walk.i < len(walk.toks):
            walk.expr(0)
            walk.i += 1  # a stray closing bracket: the rest is checked as its own expression
    except _Reject as exc:
        return f"answer cannot be evaluated in time: {exc}"
    return None
