"""Every reference in the tree resolves: a path, module, section or link that the docs, configs, docstrings or
comments name exists. A reference that no longer resolves sends a reader to nothing, so it fails here.

What counts as a reference (few false positives by design):

* a repository-relative path that starts with a top-level folder (``src/``, ``tests/``, ``benchmarks/``,
  ``configs/``, ``docs/``, ``scripts/``, or ``shared/``, which is not in the repository); ``{a,b}``
  alternatives are expanded and ``*`` / ``<name>`` match any name;
* a package-relative module path whose first folder is a ``dllm_rl`` subpackage (``rl/value.py``,
  ``dllm_rl/rl/hooks.py``);
* a dotted name (``dllm_rl.training.sharding.gathered_parameters``): its longest module prefix exists and the next
  name occurs in that module;
* a quoted section of a Markdown file (``README "Results"``, ``docs/results.md "Block-size adaptation"``): a
  heading or a bold lead of that file;
* a Markdown link to a file of the repository, and its ``#anchor``: a heading of the target.

Searched: the README, ``docs/``, ``benchmarks/`` (Markdown and Python), ``configs/`` and the Markdown and YAML of
the package, whole; Python files of ``src/``, ``benchmarks/`` and ``scripts/`` whole (their strings are help
texts and messages); tests only in their docstrings and comments (their strings build fake trees).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "dllm_rl"
# shared/ is a folder beside the repository that its readers do not have: a path into it is reported missing
TOP = ("src", "tests", "benchmarks", "configs", "docs", "scripts", "shared")
# subpackages with Python files (rl/ and sft/ are namespace packages, without __init__.py)
SUBPACKAGES = {p.name for p in PKG.iterdir() if p.is_dir() and any(p.glob("*.py"))}

ROOT_PATH = re.compile(r"(?<![\w./<-])((?:" + "|".join(TOP) + r")/[\w./{},*<>-]*[\w*}>])")
PKG_PATH = re.compile(r"(?<![\w./-])(?:dllm_rl/)?((?:[a-z_0-9]+/)+[a-z_0-9]+\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])dllm_rl((?:\.[A-Za-z_]\w*)+)")
SECTION = re.compile(r"""(?<![\w/.-])(README|docs/[\w-]+\.md)(?:'s)? "([^"\n]+)\"""")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/**/*.md"),
             *ROOT.glob("configs/**/*.yaml"), *ROOT.glob("configs/**/*.json"),
             *PKG.glob("assets/demo/**/*.md"), *PKG.glob("assets/demo/**/*.yaml")]
    return sorted(set(files))


def _python_files() -> list[Path]:
    return sorted({*PKG.rglob("*.py"), *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("scripts/**/*.py")})


def docs_and_comments(source: str) -> str:
    """The docstrings and comments of a Python file, one per line."""
    parts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expand(path[: m.start()] + alt + path[m.end():])]


def _exists(path: str) -> bool:
    path = re.sub(r"<[^<>]*>", "*", path)
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


MODULE_ATTRS = {"__file__", "__name__", "__path__", "__spec__", "__doc__"}  # every module has them


def _dotted_resolves(parts: list[str]) -> bool:
    here, i = PKG, 0
    while i < len(parts) and ((here / parts[i]).is_dir() or (here / f"{parts[i]}.py").is_file()):
        here, i = here / parts[i], i + 1
    if i == len(parts) or parts[i] in MODULE_ATTRS:
        return True
    module = here / "__init__.py" if here.is_dir() else here.with_suffix(".py")
    return module.is_file() and re.search(rf"\b{re.escape(parts[i])}\b", module.read_text()) is not None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _headings(md: Path) -> list[str]:
    return re.findall(r"^#+ (.+?)\s*$", md.read_text(), flags=re.M)


def _section_exists(md: Path, name: str) -> bool:
    text = md.read_text()
    return name in _headings(md) or f"**{name}**" in text or f"**{name}:**" in text


def broken_references(text: str, where: Path) -> list[str]:
    """What ``text`` (read from ``where``) names that does not exist, as ``file: reference`` lines."""
    rel = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    bad = []
    for m in ROOT_PATH.finditer(text):
        bad += [f"{rel}: {p}" for p in _expand(m.group(1).rstrip(".")) if not _exists(p)]
    for m in PKG_PATH.finditer(text):
        if m.group(1).split("/")[0] in SUBPACKAGES and not (PKG / m.group(1)).is_file():
            bad.append(f"{rel}: {m.group(0)}")
    for m in DOTTED.finditer(text):
        if not _dotted_resolves(m.group(1)[1:].split(".")):
            bad.append(f"{rel}: dllm_rl{m.group(1)}")
    for m in SECTION.finditer(text):
        md = ROOT / ("README.md" if m.group(1) == "README" else m.group(1))
        if not md.is_file() or not _section_exists(md, m.group(2)):
            bad.append(f'{rel}: {m.group(1)} "{m.group(2)}"')
    if where.suffix == ".md":
        bad += _broken_links(text, where, rel)
    return bad


def _broken_links(text: str, where: Path, rel: Path) -> list[str]:
    bad = []
    for m in LINK.finditer(text):
        target, _, anchor = m.group(1).partition("#")
        if "://" in target or target.startswith("mailto:"):
            continue
        md = (where.parent / target).resolve() if target else where
        if not md.exists():
            bad.append(f"{rel}: link {m.group(1)}")
        elif anchor and md.suffix == ".md" and anchor not in {slug(h) for h in _headings(md)}:
            bad.append(f"{rel}: link {m.group(1)} (no such heading)")
    return bad


def test_every_reference_resolves():
    bad = []
    for path in _text_files():
        bad += broken_references(path.read_text(), path)
    for path in _python_files():
        bad += broken_references(path.read_text(), path)
    for path in sorted(ROOT.glob("tests/**/*.py")):
        bad += broken_references(docs_and_comments(path.read_text()), path)
    assert bad == []


@pytest.mark.parametrize(("text", "found"), [
    ("see `src/dllm_rl/rl/no_such.py`", ["x.md: src/dllm_rl/rl/no_such.py"]),
    ("recipes `configs/llada2-mini-{tracerl-math,no-such}.yaml`", ["x.md: configs/llada2-mini-no-such.yaml"]),
    ("the demo config (``src/dllm_rl/assets/demo/rl-<model>.yaml``)", []),
    ("the demo config (``src/dllm_rl/assets/demo/nothing-<model>.yaml``)",
     ["x.md: src/dllm_rl/assets/demo/nothing-<model>.yaml"]),
    ("in `rl/value.py` and `rl/gone.py`", ["x.md: rl/gone.py"]),
    ("verl's `trl/trainer/grpo_config.py` is not ours", []),
    ("`dllm_rl.training.sharding.gathered_parameters`, `dllm_rl.training.nothing`",
     ["x.md: dllm_rl.training.nothing"]),
    ("`dllm_rl.training.sharding.no_such_function`", ["x.md: dllm_rl.training.sharding.no_such_function"]),
    ('(README "Results"), (README "Measured")', ['x.md: README "Measured"']),
    ('the `docs/results.md` "Block-size adaptation" table', []),
    ("[scale](docs/scale.md#two-ranks-on-cpu-or-n-gpus), [gone](docs/scale.md#gone), [x](docs/gone.md)",
     ["x.md: docs/gone.md", "x.md: link docs/scale.md#gone (no such heading)", "x.md: link docs/gone.md"]),
])
def test_a_broken_reference_is_caught(text, found):
    assert broken_references(text, ROOT / "x.md") == found


def test_docstrings_and_comments_only_in_tests():
    source = '"""Module doc: `src/a.py`."""\nPATH = "models/bad.py"  # comment: `docs/b.md`\n'
    assert docs_and_comments(source).splitlines() == ["# comment: `docs/b.md`", "Module doc: `src/a.py`."]


def test_the_training_package_docstring_names_each_of_its_modules():
    """The package docstring is the map of ``dllm_rl.training``; a module added or renamed must appear in it."""
    import dllm_rl.training as training

    modules = sorted(p.stem for p in (PKG / "training").glob("*.py") if p.stem != "__init__")
    assert [m for m in modules if f"``{m}``" not in training.__doc__] == []
