"""How hard the demo's Countdown sets are: the number of expressions over a puzzle's three numbers that reach its
target (each number once, + - * /, any order, either bracketing; exact fractions). A puzzle with few solutions is a
hard one.

    python benchmarks/countdown_difficulty.py [--rare runs/learning-40/rare_shapes.jsonl]

Prints, per set (the demo's training and held-out files, and the rare-shape set of ``benchmarks/rare_shapes.py``),
the mean number of solutions and the share of puzzles with at most 2, 3-5 and 6 or more. The rare shapes are the
puzzles the training draw rarely produced; this says what sets them apart. Enumerated by hand: three numbers give
at most 3! x 4^2 x 2 = 192 expressions, and no library counts a puzzle's solutions.
"""

from __future__ import annotations

import argparse
import itertools
import operator
from fractions import Fraction
from pathlib import Path

from rare_shapes import write_rare_set

from dllm_rl.jsonl import read_jsonl
from dllm_rl.rl.cli import DEMO_DIR

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def solution_count(nums: list[int], target: int) -> int:
    """Distinct expressions ``(a o b) o c`` and ``a o (b o c)`` over an ordering of ``nums`` that equal ``target``."""
    found = set()
    for a, b, c in itertools.permutations(Fraction(n) for n in nums):
        for (s1, f1), (s2, f2) in itertools.product(OPS.items(), repeat=2):
            for text, left in ((f"({a}{s1}{b}){s2}{c}", True), (f"{a}{s1}({b}{s2}{c})", False)):
                try:
                    value = f2(f1(a, b), c) if left else f1(a, f2(b, c))
                except ZeroDivisionError:
                    continue
                if value == target:
                    found.add(text)
    return len(found)


def describe(name: str, rows: list[dict]) -> str:
    counts = [solution_count(r["nums"], r["target"]) for r in rows]
    share = lambda lo, hi: sum(lo <= c <= hi for c in counts) / len(counts)  # noqa: E731
    return (f"| {name} | {len(rows)} | {sum(counts) / len(counts):.1f} | {share(0, 2):.0%} | {share(3, 5):.0%} | "
            f"{share(6, 10**9):.0%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rare", default="runs/learning-40/rare_shapes.jsonl", help="the rare-shape file (written "
                    "there when missing)")
    args = ap.parse_args()
    rare = write_rare_set(Path(args.rare))
    print("| set | puzzles | mean solutions | <= 2 | 3-5 | >= 6 |\n|---|---|---|---|---|---|")
    sets = (("train", DEMO_DIR / "countdown_train.jsonl"), ("held-out", DEMO_DIR / "countdown_heldout.jsonl"),
            ("rare shapes", rare))
    for name, path in sets:
        print(describe(name, read_jsonl(path)))


if __name__ == "__main__":
    main()
