"""``dllm-rl data``: make synthetic datasets, look at tasks, check the code sandbox.

dllm-rl data make countdown --n 10000 --seed 0 --out data/cd_train.jsonl --difficulty medium
dllm-rl data make sudoku --n 500 --split test --blanks 10 --out data/sudoku_test.jsonl
dllm-rl data make arith --n 5000 --operands 3 --digits 2 --out train.jsonl --exclude test.jsonl
dllm-rl data make countdown --n 5000 --out train.jsonl --test-out test.jsonl --test-n 500
dllm-rl data make shapes --n 2000 --out shapes.jsonl --test-out shapes_rare.jsonl --image-size 48
dllm-rl data show gsm8k --n 2
dllm-rl data show my.jsonl --task-type countdown --prompt-style compact
dllm-rl data pairs --model DIR --task countdown --data train.jsonl --k 8 --temperature 1 --out pairs.jsonl
dllm-rl data sandbox
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError


def register(subparsers: Any) -> None:
    """Add the ``data`` subcommand (and its own subcommands) to the top-level CLI."""
    p = subparsers.add_parser(
        "data",
        help="make synthetic datasets, inspect tasks, check the code sandbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")

    mk = sub.add_parser("make", help="generate a synthetic countdown / sudoku / arith / shapes dataset (jsonl)")
    mk.add_argument("kind", choices=["countdown", "sudoku", "arith", "shapes"])
    mk.add_argument("--n", type=int, required=True, help="number of distinct rows")
    mk.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    mk.add_argument("--out", required=True, help="output .jsonl file")
    mk.add_argument(
        "--split",
        default="train",
        choices=["train", "test"],
        help="which random stream (train and test differ for the same seed); default train",
    )
    mk.add_argument(
        "--difficulty",
        choices=["easy", "medium", "hard"],
        help="preset knobs (countdown: numbers/max-value; sudoku: blanks; arith: operands/digits)",
    )
    mk.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="FILE",
        help="never emit a row that is in FILE (repeatable): makes disjoint train/test sets",
    )
    mk.add_argument("--test-out", help="also write a disjoint test set to this file (shapes: the rare-pair set)")
    mk.add_argument("--test-n", type=int, help="rows in the --test-out set (default: n/10)")
    g = mk.add_argument_group("countdown")
    g.add_argument("--numbers", type=int, help="how many numbers per puzzle (default 3)")
    g.add_argument("--max-value", type=int, help="numbers are drawn from 1..max-value (default 100)")
    g.add_argument("--max-target", type=int, help="largest target (default: max-value)")
    g = mk.add_argument_group("sudoku")
    g.add_argument("--blanks", type=int, help="blank cells per puzzle (default 8)")
    g.add_argument("--size", type=int, help="grid size, 4 or 9 (default 4)")
    g = mk.add_argument_group("arith")
    g.add_argument("--operands", type=int, help="numbers per expression (default 3)")
    g.add_argument("--digits", type=int, help="digits per number (default 2)")
    g.add_argument("--ops", help="operators to draw from (default +-*)")
    g = mk.add_argument_group("shapes (PNG images in NAME_images/ next to the --out / --test-out file)")
    g.add_argument("--image-size", type=int, help="image width and height in px, 32..96 (default 48)")
    g.add_argument("--min-objects", type=int, help="fewest shapes per image (default 1)")
    g.add_argument("--max-objects", type=int, help="most shapes per image, up to 9 (default 4)")
    g.add_argument("--questions", help="question kinds, comma-separated: count,colour,where (default all)")
    g.add_argument("--rare-weight", type=float,
                   help="how often a rare shape-colour pair is drawn relative to the others (default 0.05)")

    sh = sub.add_parser("show", help="print a task's prompts, reference completions and their rewards")
    sh.add_argument(
        "task", help="task name (gsm8k, math, countdown, sudoku, arith, code, humaneval, mbpp, shapes, image_choice, "
                     "image_math) or a data file"
    )
    sh.add_argument("--task-type", help="task of a data file")
    sh.add_argument("--data", help="data file for a named task (default: its file in the shared data folder)")
    sh.add_argument("--split", default="test")
    sh.add_argument("--n", type=int, default=2, help="how many examples (default 2)")
    sh.add_argument("--prompt-style", default=None, choices=["chat", "plain", "compact"])

    sub.add_parser("sandbox", help="show how code is sandboxed on this machine and run a quick self-test")

    from dllm_rl.dpo.cli import add_pairs_parser

    add_pairs_parser(sub)


_KNOBS = {
    "countdown": ("numbers", "max_value", "max_target"),
    "sudoku": ("blanks", "size"),
    "arith": ("operands", "digits", "ops"),
    "shapes": ("image_size", "min_objects", "max_objects", "questions", "rare_weight"),
}


def run(args: argparse.Namespace) -> int:
    """Entry point of ``dllm-rl data``."""
    cmd = getattr(args, "data_command", None)
    try:
        if cmd == "make":
            return _make(args)
        if cmd == "show":
            return _show(args)
        if cmd == "sandbox":
            return _sandbox()
        if cmd == "pairs":
            from dllm_rl.dpo.cli import make_pairs

            return make_pairs(args)
    except ImportError as exc:  # an optional package (datasets, pyarrow) is missing: one clear line
        raise UserError(str(exc)) from exc
    raise UserError("missing action: use 'dllm-rl data make|show|pairs|sandbox' (see dllm-rl data --help)")


def _make(args: argparse.Namespace) -> int:
    from dllm_rl.jsonl import write_jsonl

    from .synthetic import keys_of, make, make_split_pair

    for f in args.exclude:
        if not Path(f).exists():
            raise FileNotFoundError(f"--exclude file {f} does not exist")
    if args.test_out and Path(args.test_out).resolve() == Path(args.out).resolve():
        raise UserError(f"--out and --test-out are the same file ({args.out}): the train rows would replace the "
                        "test rows; give two files")
    if args.kind == "shapes":
        return _make_shapes(args)
    exclude = keys_of(args.kind, args.exclude)
    knobs = {k: getattr(args, k) for k in _KNOBS[args.kind]}
    if args.test_out:
        test_n = args.test_n if args.test_n is not None else max(1, args.n // 10)
        train, test = make_split_pair(
            args.kind, args.n, test_n, args.seed, difficulty=args.difficulty, exclude=exclude, **knobs
        )
        write_jsonl(args.test_out, test)
        print(f"wrote {len(test)} {args.kind} test rows to {args.test_out}")
    else:
        train = make(
            args.kind,
            args.n,
            args.seed,
            difficulty=args.difficulty,
            split=args.split,
            exclude=exclude,
            **knobs,
        )
    write_jsonl(args.out, train)
    label = "train" if args.test_out else args.split
    print(f"wrote {len(train)} {args.kind} {label} rows to {args.out}")
    return 0


def _make_shapes(args: argparse.Namespace) -> int:
    from . import shapes

    knobs: dict[str, Any] = dict(shapes.DIFFICULTY[args.difficulty]) if args.difficulty else {}
    given = {"size": args.image_size, "min_objects": args.min_objects, "max_objects": args.max_objects,
             "rare_weight": args.rare_weight,
             "kinds": [k.strip() for k in args.questions.split(",")] if args.questions else None}
    knobs.update({k: v for k, v in given.items() if v is not None})
    exclude = shapes.keys_of(args.exclude)
    if args.test_out:
        test_n = args.test_n if args.test_n is not None else max(1, args.n // 10)
        train, test = shapes.make_shapes_pair(args.n, test_n, args.seed, exclude=exclude, **knobs)
        shapes.write_shapes(args.test_out, test)
        print(f"wrote {len(test)} shapes rare-pair test rows to {args.test_out} (images in "
              f"{shapes.image_folder(args.test_out)})")
    else:
        train = shapes.make_shapes(args.n, args.seed, split=args.split, exclude=exclude, **knobs)
    shapes.write_shapes(args.out, train)
    label = "train" if args.test_out else args.split
    print(f"wrote {len(train)} shapes {label} rows to {args.out} (images in {shapes.image_folder(args.out)})")
    return 0


def _show(args: argparse.Namespace) -> int:
    from . import get_task

    opts: dict[str, Any] = {"split": args.split, "limit": args.n}
    if args.prompt_style:
        opts["prompt_style"] = args.prompt_style
    if args.data:
        opts["data"] = args.data
    if args.task_type:
        opts["task_type"] = args.task_type
    task = get_task(args.task, **opts)
    examples = task.examples
    refs = [task.reference_completion(ex) or "" for ex in examples]
    scores = task.score_examples(refs, examples) if examples else []
    print(f"{task!r}: {len(examples)} examples shown")
    for ex, ref, s in zip(examples, refs, scores):
        print("-" * 80)
        print("PROMPT:\n" + task.build_prompt(ex))
        print("REFERENCE COMPLETION:\n" + (ref or "(none)"))
        print(f"REWARD: {float(s):.3f} ({s.reason})")
    print(json.dumps(task.metrics(scores)))
    task.close()
    return 0


def _sandbox() -> int:
    from ..sandbox import Sandbox, SandboxLimits

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    sb = Sandbox(SandboxLimits(timeout_s=5))
    print("sandbox:", sb.isolation.describe())
    for note in sb.isolation.notes:
        print("note:", note)
    ok = sb.run_function_tests("def f(x):\n    return x + 1\n", ["assert f(1) == 2"]).fraction == 1.0
    bad = sb.run_function_tests("import sys\nsys.exit(0)\n", ["assert f(1) == 2"]).fraction == 0.0
    print(f"self-test: correct program passes: {ok}; sys.exit(0) does not pass: {bad}")
    return 0 if ok and bad else 1
