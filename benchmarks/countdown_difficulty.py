"""How hard the demo's Countdown sets are: the number of expressions over a puzzle's three numbers that reach its
target (each number once, + - * /, any order, either bracketing; exact fractions). A puzzle with few solutions is a
hard one.

    python benchmarks/countdown_difficulty.py [--rare runs/learning-40/rare_shapes.jsonl]
    python benchmarks/countdown_difficulty.py --model src/dllm_rl/assets/demo/sdar-countdown --model RUN/final

Prints, per set (the demo's training and held-out files, and the rare-shape set of ``benchmarks/rare_shapes.py``),
the mean number of solutions, the share of puzzles with at most 2, 3-5 and 6 or more, and the share that + and -
alone solve. The rare shapes are the puzzles the training draw rarely produced; this says what sets them apart.
``--model`` (repeatable) adds, per checkpoint, its greedy held-out and rare-shape accuracy (the demo's decoding)
on the puzzles + and - solve and on the others, and the share of its answers that use * or / and brackets: an RL
run that narrows onto sums and differences shows there. Enumerated by hand: three numbers give at most
3! x 4^2 x 2 = 192 expressions, and no library counts a puzzle's solutions.
"""

from __future__ import annotations

import argparse
import itertools
import operator
from fractions import Fraction
from pathlib import Path

from rare_shapes import demo_decode, write_rare_set

from dllm_rl.jsonl import read_jsonl
from dllm_rl.rl.cli import DEMO_DIR
from dllm_rl.tasks.extract import tagged

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


def plus_minus(nums: list[int], target: int) -> bool:
    """Whether + and - alone reach ``target`` (each number once): a signed sum with at least one term added (a
    leading subtraction can always be written behind an added term)."""
    return any(1 in signs and sum(s * n for s, n in zip(signs, nums)) == target
               for signs in itertools.product((1, -1), repeat=len(nums)))


def describe(name: str, rows: list[dict]) -> str:
    counts = [solution_count(r["nums"], r["target"]) for r in rows]
    share = lambda lo, hi: sum(lo <= c <= hi for c in counts) / len(counts)  # noqa: E731
    pm = sum(plus_minus(r["nums"], r["target"]) for r in rows) / len(rows)
    return (f"| {name} | {len(rows)} | {sum(counts) / len(counts):.1f} | {share(0, 2):.0%} | {share(3, 5):.0%} | "
            f"{share(6, 10**9):.0%} | {pm:.0%} |")


def answers(model_dir: str, kind: str, name: str, path: Path) -> str:
    """A row of ``model_dir``'s greedy answers on the set at ``path``: accuracy on the puzzles + and - solve and
    on the others, and the shares of its answers with * or / and with brackets."""
    rows = read_jsonl(path)
    res = demo_decode(model_dir, kind, path)
    pm = [plus_minus(r["nums"], r["target"]) for r in rows]
    right = [float(s) >= 1.0 for s in res.scores]
    exprs = [tagged(t) or "" for t in res.texts]

    def rate(hits: list[bool], of: list[bool]) -> str:
        n = sum(of)
        return f"{sum(h and o for h, o in zip(hits, of))}/{n}" if n else "-"

    every = [True] * len(rows)
    return (f"| {model_dir} | {name} | {res.accuracy:.1%} | {rate(right, pm)} | {rate(right, [not p for p in pm])} | "
            f"{sum(any(o in e for o in '*/') for e in exprs) / len(rows):.0%} | "
            f"{rate(['(' in e for e in exprs], every)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rare", default="runs/learning-40/rare_shapes.jsonl", help="the rare-shape file (written "
                    "there when missing)")
    ap.add_argument("--model", action="append", default=[], help="a checkpoint whose greedy answers to the "
                    "held-out and rare-shape puzzles are broken down (repeatable)")
    ap.add_argument("--kind", choices=("full", "block"), default="block", help="the demo whose decoding --model uses")
    args = ap.parse_args()
    rare = write_rare_set(Path(args.rare))
    print("| set | puzzles | mean solutions | <= 2 | 3-5 | >= 6 | + and - alone |\n|---|---|---|---|---|---|---|")
    sets = (("train", DEMO_DIR / "countdown_train.jsonl"), ("held-out", DEMO_DIR / "countdown_heldout.jsonl"),
            ("rare shapes", rare))
    for name, path in sets:
        print(describe(name, read_jsonl(path)))
    if args.model:
        print("\n| checkpoint | set | accuracy | right, + and - puzzles | right, the others | answers with * or / | "
              "answers with brackets |\n|---|---|---|---|---|---|---|")
        for model_dir in args.model:
            for name, path in sets[1:]:
                print(answers(model_dir, args.kind, name, path), flush=True)


if __name__ == "__main__":
    main()
