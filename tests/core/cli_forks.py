"""Run many ``python -m dllm_rl ARGS`` command lines as real processes for the price of one interpreter start.

Reads ``{name: {"args": [...], "env": {...}}}`` (JSON) on stdin; imports what every command imports (torch,
transformers) once, then forks one child per command line, which sets its ``env`` (e.g. ``HOME``, which ``~``
expands to) and runs the package's ``__main__`` exactly as ``python -m dllm_rl`` does
(``sys.argv``, ``SystemExit``, an uncaught exception printed as a traceback with status 1) with its stderr in a
file and its stdout discarded. Prints ``{name: [exit status, stderr]}`` (JSON). Used by ``test_user_errors.py``:
forty fresh interpreters, each importing torch, cost minutes of CPU on a small machine; forty forks cost seconds.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import traceback

#: what the commands import on their way to a user error (a child imports the rest itself)
PRELOAD = ("dllm_rl.eval.harness", "dllm_rl.rl.config", "dllm_rl.sft.trainer", "dllm_rl.tasks", "dllm_rl.training",
           "matplotlib.pyplot", "pyarrow.parquet", "transformers")


def _child(args: list[str], env: dict[str, str], err_path: str) -> None:
    code = 1
    try:
        os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.environ.update(env)
        sys.argv = ["dllm_rl", *args]
        try:
            runpy.run_module("dllm_rl", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:  # what the interpreter does with it
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - an uncaught exception: the interpreter prints its traceback
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    cases: dict[str, dict] = json.load(sys.stdin)
    import importlib

    from dllm_rl.cli import build_parser

    build_parser()  # every subcommand's imports, once, before forking
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    width = os.cpu_count() or 1
    out, running = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        pending = list(cases.items())
        while pending or running:
            while pending and len(running) < width:
                name, case = pending.pop(0)
                err_path = os.path.join(tmp, f"{len(out) + len(running)}.err")
                pid = os.fork()
                if pid == 0:
                    _child(case["args"], case.get("env", {}), err_path)
                running[pid] = (name, err_path)
            pid, status = os.wait()
            name, err_path = running.pop(pid)
            with open(err_path, encoding="utf-8", errors="replace") as f:
                out[name] = [os.waitstatus_to_exitcode(status), f.read()]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
