"""``dllm-rl data``: make synthetic datasets, look at tasks, check the code sandbox.

dllm-rl data make countdown --n 10000 --seed 0 --out data/cd_train.jsonl --difficulty medium
dllm-rl data make sudoku --n 500 --split test --blanks 10 --out data/sudoku_test.jsonl
dllm-rl data make arith --n 5000 --operands 3 --digits 2 --out train.jsonl --exclude test.jsonl
dllm-rl data make countdown --n 5000 --out train.jsonl --test-out test.jsonl --test-n 500
dllm-rl data make shapes --n 2000 --out shapes.jsonl --test-out shapes_rare.jsonl --image-size 48
dllm-rl data show gsm8k --n 2
dllm-rl data show my.jsonl --task-type countdown --prompt-style compact
dllm-rl data sandbox
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError
from dllm_rl.tasks.data_config import KNOBS, MakeDataConfig, SandboxCheckConfig, ShowDataConfig

#: sub-command -> (its one-line help, its config class, the key a bare word sets)
ACTIONS: dict[str, tuple[str, type, str | None]] = {
    "make": ("generate a synthetic countdown / sudoku / arith / shapes dataset (jsonl)", MakeDataConfig, "task"),
    "show": ("print a task's prompts, reference completions and their rewards", ShowDataConfig, "task"),
    "sandbox": ("show how code is sandboxed on this machine and run a quick self-test", SandboxCheckConfig, None),
}


def register(subparsers: Any) -> None:
    """Add the ``data`` subcommand (and its own subcommands, each on the one front end with its config class,
    :mod:`dllm_rl.tasks.data_config`) to the top-level CLI."""
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument

    p = subparsers.add_parser(
        "data",
        help="make synthetic datasets, inspect tasks, check the code sandbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    for action, (text, cls, positional) in ACTIONS.items():
        a = sub.add_parser(action, help=text, description=(cls.__doc__ or "").strip().replace("``", ""))
        add_command_arguments(a, cls, positional=positional, words_help=(
            f"{positional.upper()}, " if positional else "") + "a YAML config, key=value overrides (see --help-config)")
        help_config_argument(a, lambda cls=cls: describe(cls))


def run(args: argparse.Namespace) -> int:
    """Entry point of ``dllm-rl data``."""
    from dllm_rl.config.command import load_command

    cmd = getattr(args, "data_command", None)
    if cmd not in ACTIONS:
        raise UserError("missing action: use 'dllm-rl data make|show|sandbox' (see dllm-rl data --help)")
    _, cls, positional = ACTIONS[cmd]
    cfg = load_command(cls, args, None, positional=positional)
    try:
        return {"make": _make, "show": _show, "sandbox": _sandbox}[cmd](cfg)
    except ImportError as exc:  # an optional package (datasets, pyarrow) is missing: one clear line
        raise UserError(str(exc)) from exc


def _make(cfg: MakeDataConfig) -> int:
    from dllm_rl.jsonl import write_jsonl

    from .synthetic import keys_of, make, make_split_pair

    for f in cfg.exclude:
        if not Path(f).exists():
            raise FileNotFoundError(f"--exclude file {f} does not exist")
    if cfg.test_out and Path(cfg.test_out).resolve() == Path(cfg.out).resolve():
        raise UserError(f"--out and --test-out are the same file ({cfg.out}): the train rows would replace the "
                        "test rows; give two files")
    if cfg.task == "shapes":
        return _make_shapes(cfg)
    exclude = keys_of(cfg.task, cfg.exclude)
    knobs = {k: getattr(cfg, k) for k in KNOBS[cfg.task]}
    if cfg.test_out:
        test_n = cfg.test_n if cfg.test_n is not None else max(1, cfg.n // 10)
        train, test = make_split_pair(
            cfg.task, cfg.n, test_n, cfg.seed, difficulty=cfg.difficulty, exclude=exclude, **knobs
        )
        write_jsonl(cfg.test_out, test)
        print(f"wrote {len(test)} {cfg.task} test rows to {cfg.test_out}")
    else:
        train = make(cfg.task, cfg.n, cfg.seed, difficulty=cfg.difficulty, split=cfg.split, exclude=exclude, **knobs)
    write_jsonl(cfg.out, train)
    label = "train" if cfg.test_out else cfg.split
    print(f"wrote {len(train)} {cfg.task} {label} rows to {cfg.out}")
    return 0


def _make_shapes(cfg: MakeDataConfig) -> int:
    from . import shapes

    knobs: dict[str, Any] = dict(shapes.DIFFICULTY[cfg.difficulty]) if cfg.difficulty else {}
    given = {"size": cfg.image_size, "min_objects": cfg.min_objects, "max_objects": cfg.max_objects,
             "rare_weight": cfg.rare_weight,
             "kinds": [k.strip() for k in cfg.questions.split(",")] if cfg.questions else None}
    knobs.update({k: v for k, v in given.items() if v is not None})
    exclude = shapes.keys_of(cfg.exclude)
    if cfg.test_out:
        test_n = cfg.test_n if cfg.test_n is not None else max(1, cfg.n // 10)
        train, test = shapes.make_shapes_pair(cfg.n, test_n, cfg.seed, exclude=exclude, **knobs)
        shapes.write_shapes(cfg.test_out, test)
        print(f"wrote {len(test)} shapes rare-pair test rows to {cfg.test_out} (images in "
              f"{shapes.image_folder(cfg.test_out)})")
    else:
        train = shapes.make_shapes(cfg.n, cfg.seed, split=cfg.split, exclude=exclude, **knobs)
    shapes.write_shapes(cfg.out, train)
    label = "train" if cfg.test_out else cfg.split
    print(f"wrote {len(train)} shapes {label} rows to {cfg.out} (images in {shapes.image_folder(cfg.out)})")
    return 0


def _show(cfg: ShowDataConfig) -> int:
    from . import get_task

    opts: dict[str, Any] = {"split": cfg.split, "limit": cfg.n}
    if cfg.prompt_style:
        opts["prompt_style"] = cfg.prompt_style
    if cfg.data:
        opts["data"] = cfg.data
    if cfg.task_type:
        opts["task_type"] = cfg.task_type
    task = get_task(cfg.task, **opts)
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


def _sandbox(cfg: SandboxCheckConfig) -> int:
    from ..sandbox import Sandbox, SandboxLimits

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    sb = Sandbox(SandboxLimits(timeout_s=cfg.timeout_s))
    print("sandbox:", sb.isolation.describe())
    for note in sb.isolation.notes:
        print("note:", note)
    ok = sb.run_function_tests("def f(x):\n    return x + 1\n", ["assert f(1) == 2"]).fraction == 1.0
    bad = sb.run_function_tests("import sys\nsys.exit(0)\n", ["assert f(1) == 2"]).fraction == 0.0
    print(f"self-test: correct program passes: {ok}; sys.exit(0) does not pass: {bad}")
    return 0 if ok and bad else 1
