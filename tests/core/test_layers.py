"""The layer picture of the README holds: every ``dllm_rl`` import (module level or inside a function) goes from
a package to a lower layer; the ground floor's modules may use one another. No modules import each other in a
circle, deferred imports (inside a function, under ``TYPE_CHECKING``) included, and ``importlib.import_module``
(an import the AST cannot see) is used only where a name is known at run time."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dllm_rl"

#: top to bottom, as the README's architecture table (a listed package that does not exist yet is allowed)
LAYERS = [
    ("cli", ("cli", "__main__", "serve", "api", "__init__")),
    ("preference", ("dpo",)),
    ("trainers", ("rl", "sft")),
    ("eval", ("eval",)),
    ("rewards", ("rewards",)),
    ("estimators", ("estimators",)),
    ("sampling", ("sampling",)),
    ("training", ("training",)),
    ("models", ("models",)),
    ("tasks", ("tasks",)),
    ("sandbox", ("sandbox",)),
    ("ground", ("config", "jsonl", "errors", "seeding", "hub", "registry", "threads", "version")),
]
#: rows whose packages may import one another (the two entry modules; the ground floor's utilities)
SHARED = ("cli", "ground")


def _level() -> dict[str, int]:
    return {pkg: len(LAYERS) - 1 - i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


def _imports(path: Path, src: Path) -> list[tuple[int, str]]:
    """(line, top-level dllm_rl unit) of every absolute or relative dllm_rl import of a file."""
    out = []
    package = path.relative_to(src).parent.parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "dllm_rl":
            # `from dllm_rl import errors` imports the module errors; `from dllm_rl import __version__`, the package
            names = [f"dllm_rl.{a.name}" if (src / a.name).is_dir() or (src / f"{a.name}.py").is_file() else "dllm_rl"
                     for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.ImportFrom):  # relative: resolved against the file's package
            base = package[: len(package) - node.level + 1]
            names = [".".join(("dllm_rl", *base, node.module or ""))]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "dllm_rl":
                out.append((node.lineno, parts[1] if len(parts) > 1 and parts[1] else "__init__"))
    return out


def upward_imports(src: Path = SRC) -> list[str]:
    """``file:line: package (layer) imports package (layer)`` for every import that does not go down."""
    level, names = _level(), [name for name, _ in reversed(LAYERS)]
    bad = []
    for path in sorted(src.rglob("*.py")):
        where = path.relative_to(src.parent)
        unit = path.relative_to(src).with_suffix("").parts[0]  # rl/trainer.py -> rl, jsonl.py -> jsonl
        assert unit in level, f"{where}: package {unit!r} is in no layer of LAYERS (and the README)"
        for line, dst in _imports(path, src):
            assert dst in level, f"{where}:{line}: imports dllm_rl.{dst}, which is in no layer"
            if dst == unit or (level[dst] == level[unit] and names[level[unit]] in SHARED):
                continue
            if level[dst] >= level[unit]:
                bad.append(f"{where}:{line}: {unit} ({names[level[unit]]}) imports {dst} ({names[level[dst]]})")
    return bad


def test_no_module_imports_a_layer_above_or_beside_it():
    assert upward_imports() == []


def test_the_readme_table_is_this_table():
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\w+) \| ((?:`[\w_]+`(?:, )?)+) \|", text, flags=re.M)
    assert [(layer, tuple(re.findall(r"`([\w_]+)`", pkgs))) for layer, pkgs in rows] == LAYERS


def test_an_upward_import_is_caught(tmp_path):
    """Function-level and relative imports count; a package beside its own (rl -> sft) is refused too; the
    ground floor may use itself."""
    fake = tmp_path / "dllm_rl"
    for d in ("models", "rl"):
        (fake / d).mkdir(parents=True)
    (fake / "models" / "bad.py").write_text("def f():\n    from dllm_rl.rl.trainer import RLTrainer\n")
    (fake / "models" / "rel.py").write_text("import torch\n\nfrom ..sampling import generate\nfrom . import masks\n")
    (fake / "rl" / "side.py").write_text("import dllm_rl.sft.trainer\nimport dllm_rl.eval\n")
    (fake / "jsonl.py").write_text("from dllm_rl import errors\nfrom dllm_rl.errors import UserError\n")
    (fake / "errors.py").write_text("class UserError(Exception):\n    pass\n")
    assert upward_imports(fake) == ["dllm_rl/models/bad.py:2: models (models) imports rl (trainers)",
                                    "dllm_rl/models/rel.py:3: models (models) imports sampling (sampling)",
                                    "dllm_rl/rl/side.py:1: rl (trainers) imports sft (trainers)"]


def _module_name(path: Path, src: Path) -> str:
    """``dllm_rl.rl.trainer`` for rl/trainer.py, ``dllm_rl.rl`` for the rl package's ``__init__``."""
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, package: str, modules: set[str]) -> list[str]:
    """The modules of ``modules`` that import ``node`` names: ``from a.b import c`` imports module ``a.b.c`` when
    there is one, else ``a.b`` (the nearest existing module above a name that is not one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: against the file's package
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*up, *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
        return []
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each module of ``src`` -> the modules of ``src`` it imports anywhere (module level, inside functions, under
    ``TYPE_CHECKING``). A package's ``__init__`` counts only where it is named, not as the parent every import of a
    submodule runs first (a package that imports its submodules is no circle)."""
    files = {_module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {t for node in ast.walk(ast.parse(path.read_text(), str(path)))
                       for t in _targets(node, package, set(files)) if t != name}
    return graph


def import_cycles(src: Path = SRC) -> list[list[str]]:
    """The circles of imports in ``src``, each as its modules sorted, found one at a time (each broken once found)
    until none is left; [] when none."""
    graph, cycles = import_graph(src), []
    while True:
        try:
            TopologicalSorter(graph).prepare()
            return sorted(cycles)
        except CycleError as exc:
            ring = exc.args[1][:-1]  # [a, b, ..., a]: the circle found
            cycles.append(sorted(set(ring)))
            for a, b in zip(ring, [*ring[1:], ring[0]]):
                graph[b].discard(a)  # break it (b imports a in the sorter's order), then look for another


def test_no_module_is_in_an_import_circle():
    assert import_cycles() == []


def test_an_import_circle_is_caught(tmp_path):
    """A circle held by a deferred import, one under TYPE_CHECKING and a relative one are found; a package whose
    ``__init__`` imports its submodules is not a circle."""
    fake = tmp_path / "dllm_rl"
    for d in ("sampling", "rl"):
        (fake / d).mkdir(parents=True)
    (fake / "sampling" / "__init__.py").write_text("from dllm_rl.sampling.decode import generate\n")
    (fake / "sampling" / "decode.py").write_text("def generate():\n    from dllm_rl.sampling.engine import Engine\n")
    (fake / "sampling" / "engine.py").write_text("from dllm_rl.sampling import decode\n")
    (fake / "rl" / "judge.py").write_text("from .judge_backends import HF\nclass JudgeConfig: ...\n")
    (fake / "rl" / "judge_backends.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                   "    from dllm_rl.rl.judge import JudgeConfig\nclass HF: ...\n")
    (fake / "rl" / "curriculum.py").write_text("import dllm_rl.rl.judge\n")
    assert import_cycles(fake) == [["dllm_rl.rl.judge", "dllm_rl.rl.judge_backends"],
                                   ["dllm_rl.sampling.decode", "dllm_rl.sampling.engine"]]


#: Where ``importlib.import_module`` is used, and why a plain import cannot do there.
IMPORT_MODULE_SITES = {
    "dllm_rl/__init__.py": "the lazy names of the Python API (PEP 562): import dllm_rl loads no subcommand",
    "dllm_rl/cli.py": "the module of the one subcommand named on the command line",
    "dllm_rl/rl/methods/__init__.py": "every module found in the methods folder (a method is one new module)",
    "dllm_rl/tasks/__init__.py": "a task registered as 'module:Class', imported when it is first built",
    "dllm_rl/tasks/base.py": "a user's 'module:function' reward",
}


def test_import_module_is_used_only_for_names_known_at_run_time():
    found = {p.relative_to(SRC.parent).as_posix() for p in SRC.rglob("*.py") if "import_module(" in p.read_text()}
    assert sorted(found) == sorted(IMPORT_MODULE_SITES)
