"""What the data-making tests share (synthetic rows, shapes): ``dllm-rl data ...`` through its own parser, and the
rows of the JSONL files it writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dllm_rl.tasks import cli


def run_cli(*argv: str) -> int:
    """``dllm-rl data ARGS`` in-process (the ``data`` subcommand alone); its return status."""
    parser = argparse.ArgumentParser(prog="dllm-rl")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]
