"""The layer picture of the README holds: every ``dllm_rl`` import (module level or inside a function) goes from
a package to a lower layer; the ground floor's modules may use one another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "dllm_rl"

#: top to bottom, as the README's architecture table (a listed package that does not exist yet is allowed)
LAYERS = [
    ("cli", ("cli", "__main__", "serve", "api", "__init__")),
    ("preference", ("dpo",)),
    ("trainers", ("rl", "sft")),
    ("eval", ("eval",)),
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
