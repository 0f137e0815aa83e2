"""Start-up stays light: ``import dllm_rl``, ``dllm-rl --version`` and ``dllm-rl --help`` import neither torch nor
transformers (which take 5-10 s on 2 cores), and a subcommand imports only its own module. Checked through
``sys.modules`` in a fresh interpreter (a robust proxy for the time, which a loaded machine would make flaky)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")


def _fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter, then report what it printed and which modules it imported."""
    wrapper = (
        "import contextlib, io, json, sys\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    try:\n"
        + "".join(f"        {line}\n" for line in code.splitlines())
        + "    except SystemExit as exc:\n"
        "        code = exc.code\n"
        "print(json.dumps({'out': out.getvalue(), 'modules': sorted(sys.modules)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY]


def test_import_dllm_rl_imports_no_torch():
    run = _fresh("import dllm_rl\nprint(dllm_rl.__version__)")
    assert run["out"].strip() == _version()
    assert _heavy(run["modules"]) == []


def _version() -> str:
    import dllm_rl

    return dllm_rl.__version__


def test_version_and_help_import_no_torch_and_no_subcommand():
    version = _fresh("from dllm_rl.cli import main\nmain(['--version'])")
    assert version["out"] == f"dllm-rl {_version()}\n"
    assert _heavy(version["modules"]) == []
    listing = _fresh("from dllm_rl.cli import main\nmain(['--help'])")
    assert "rl        RL post-training (presets: " in listing["out"] and "serve     serve a model" in listing["out"]
    assert _heavy(listing["modules"]) == []
    assert not [m for m in listing["modules"] if m.endswith(".cli") and m not in ("dllm_rl.cli", "dllm_rl.rl.cli")]


def test_a_subcommand_imports_only_its_own_module():
    run = _fresh("from dllm_rl.cli import main\nmain(['sft', '--help'])")
    assert "usage: dllm-rl sft" in run["out"]
    assert "dllm_rl.sft.cli" in run["modules"]
    others = {"dllm_rl.serve.cli", "dllm_rl.eval.cli", "dllm_rl.models.cli", "dllm_rl.sampling.cli", "dllm_rl.dpo.cli"}
    assert others.isdisjoint(run["modules"])


def test_the_command_list_is_what_each_module_registers():
    """The listing that ``--help`` prints without importing the subcommands (cli.SUBCOMMANDS) says, for every
    command, what its module registers, and names every command they register."""
    from dllm_rl.cli import SUBCOMMANDS, build_parser, command_help

    sub = build_parser()._subparsers._group_actions[0]
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == {name: command_help(name) for name in SUBCOMMANDS}
