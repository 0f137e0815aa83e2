"""A deterministic corpus of junk completions for checking that no reward can be stalled.

:func:`junk_completions` yields ``n`` completions for a task, generated from a seed (no files), cycling
through the families in :data:`FAMILIES`: nesting bombs, power towers and other answers whose
evaluation explodes (factorials, binomials, symbolic expansions), 1 MB strings, random Unicode, huge
literals, deep parentheses, unbalanced braces and valid-looking answers with junk around them. Each
payload is wrapped in one of the task's answer formats (``\\boxed{}``, ``#### x``, ``<answer>``, a
```` ```python ```` block, or none), so the junk reaches the answer parser and not only the extractor.
:data:`FUZZ_ROWS` holds one example row per task to score the corpus against.

Used by ``benchmarks/rewards.py`` (the slowest single scoring call per task) and by the tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

MB = 1 << 20

FUZZ_ROWS: dict[str, dict] = {
    "gsm8k": {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"},
    "math": {"problem": "Compute 1/2.", "answer": "\\frac{1}{2}"},
    "countdown": {"input": "3,5,7", "output": "22"},
    "sudoku": {"Puzzle": "3102200002100320", "Solution": "3142243142131324"},
    "code": {"text": "Add one.", "test_list": ["assert f(1) == 2", "assert f(2) == 3"]},
}

_FORMATS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("\\boxed{%s}", "#### %s", "The answer is %s", "%s"),
    "math": ("\\boxed{%s}", "so $\\boxed{%s}$.", "%s"),
    "countdown": ("<answer>%s</answer>", "<answer>%s", "%s"),
    "sudoku": ("<answer>%s</answer>", "%s"),
    "code": ("```python\n%s\n```", "%s"),
}

_VALID: dict[str, tuple[str, ...]] = {
    "gsm8k": ("4", "$4.00", "2+2 = 4", "-4", "4/1"),
    "math": ("\\frac{1}{2}", "0.5", "\\dfrac12", "x^2+1", "(3, \\frac{\\pi}{2})"),
    "countdown": ("3*5+7", "(3+5)*7", "7*3+5", "22"),
    "sudoku": ("3142243142131324", "3 1 4 2\n2 4 3 1\n4 2 1 3\n1 3 2 4", "1" * 16),
    "code": ("def f(x):\n    return x + 1", "def f(x):\n    return x"),
}

_BLOWUPS = (
    "({a}^{b})!", "{n}!", "{a}!!!!", "\\binom{{{n}}}{{{k}}}", "(x+y+z+w)^{{{k}}}", "\\Gamma({n})",
    "10^{{10^{{{k}}}}}", "(x+1)^{{{k}}}(x+2)^{{{k}}}(x+3)^{{{k}}}", "{a}^{{{n}}}", "e^{{e^{{e^{{{a}}}}}}}",
    "{a}**{b}**{a}", "\\sqrt[{n}]{{{a}^{{{n}}}}}", "\\frac{{{a}^{{{n}}}}}{{{b}^{{{n}}}}}",
)  # fmt: skip
_CHUNKS = ("lorem ipsum ", "{", "}", "\\boxed{", "<answer>", "#### ", "9", "(", "\\frac{", "^{9", "\n", " ")
_PIECES = ("{", "}", "\\boxed{", "\\frac{", "(", ")", "<answer>", "</answer>", "^", "!", "**", "9", "x", "\\")
_UNICODE = ((0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x4E00, 0x4FFF), (0x1F600, 0x1F64F), (0x0, 0x1F),
            (0xD800, 0xDFFF), (0x2000, 0x206F), (0xFF00, 0xFFEF))  # fmt: skip


def _size(rng: random.Random) -> int:
    """A length: mostly small, sometimes up to 1 MB."""
    return rng.choice((rng.randint(1, 100), rng.randint(100, 10_000), rng.randint(10_000, MB)))


def _nesting_bomb(rng: random.Random, task: str) -> str:
    left, right = rng.choice((("\\boxed{", "}"), ("{", "}"), ("(", ")"), ("\\frac{", "}{1}"), ("[", "]")))
    k = max(1, _size(rng) // (len(left) + len(right)))
    return left * k + str(rng.randint(0, 99)) + right * k


def _power_tower(rng: random.Random, task: str) -> str:
    height, out = rng.randint(2, 8), str(rng.randint(2, 99))
    for _ in range(height):
        base = rng.randint(2, 99)
        out = f"{base}**{out}" if rng.random() < 0.3 else f"{base}^{{{out}}}"
    return out


def _blowup(rng: random.Random, task: str) -> str:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    n, k = rng.choice((10**3, 10**6, 10**9, rng.randint(1, 10**7))), rng.randint(5, 500)
    return rng.choice(_BLOWUPS).format(a=a, b=b, n=n, k=k)


def _huge_string(rng: random.Random, task: str) -> str:
    chunk = rng.choice(_CHUNKS)
    return chunk * (MB // len(chunk))


def _random_unicode(rng: random.Random, task: str) -> str:
    spans = [rng.choice(_UNICODE) for _ in range(3)]
    return "".join(chr(rng.randint(*rng.choice(spans))) for _ in range(rng.randint(1, 5000)))


def _huge_literal(rng: random.Random, task: str) -> str:
    digits = "".join(rng.choices("0123456789", k=rng.randint(1, 64))) * (_size(rng) // 32 + 1)
    return rng.choice((digits, f"{digits}.{digits[:50]}", f"1e{digits[:9]}", f"{digits[:60]}/{digits[:1000]}"))


def _deep_parens(rng: random.Random, task: str) -> str:
    k = rng.randint(1, 100_000)
    return "(" * k + rng.choice(("1", "3*5+7", "x")) + ")" * rng.choice((k, k // 2, 0))


def _unbalanced(rng: random.Random, task: str) -> str:
    return "".join(rng.choices(_PIECES, k=rng.randint(1, 20_000)))


def _valid_with_junk(rng: random.Random, task: str) -> str:
    answer = rng.choice(_VALID[task])
    junk = "".join(rng.choices(_PIECES + _CHUNKS, k=rng.randint(0, 2000)))
    return rng.choice((f"{junk}{answer}", f"{answer}{junk}", f"{answer} " * rng.randint(1, 10_000)))


FAMILIES: dict[str, Callable[[random.Random, str], str]] = {
    "nesting_bomb": _nesting_bomb,
    "power_tower": _power_tower,
    "blowup": _blowup,
    "huge_string": _huge_string,
    "random_unicode": _random_unicode,
    "huge_literal": _huge_literal,
    "deep_parens": _deep_parens,
    "unbalanced": _unbalanced,
    "valid_with_junk": _valid_with_junk,
}


def junk_completions(task: str, n: int, seed: int = 0) -> Iterator[tuple[str, str]]:
    """``(family, completion)`` pairs, ``n`` of them, for ``task`` (a key of :data:`FUZZ_ROWS`),
    the same for the same seed. Families take turns; each payload gets one of the task's answer
    formats at random. Generated lazily: a completion can be 1 MB."""
    if task not in _FORMATS:
        raise ValueError(f"no fuzz corpus for task {task!r}; choose one of {', '.join(_FORMATS)}")
    rng = random.Random(f"{seed}:{task}")
    names = list(FAMILIES)
    for i in range(n):
        family = names[i % len(names)]
        payload = FAMILIES[family](rng, task)
        yield family, rng.choice(_FORMATS[task]).replace("%s", payload, 1)
