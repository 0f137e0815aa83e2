"""Write every generated part of the docs (``make docs``): the configuration reference (``docs/config.md``, from
:mod:`config_reference`) and the preset table of ``docs/methods.md`` (from the methods' declarations,
:func:`dllm_rl.rl.presets.methods_table`), between its two marker lines.

    python scripts/make_docs.py          # write them
    python scripts/make_docs.py --check  # exit 1, naming the stale files, when a file differs from its output

``tests/core/test_config_renames.py`` checks that the tree equals this output, so a new method (one module and one
recipe) needs only ``make docs``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the lines around the generated preset table of docs/methods.md (kept by the generator)
TABLE_BEGIN = "<!-- preset table: written by `make docs` from src/dllm_rl/rl/methods/; do not edit -->"
TABLE_END = "<!-- end of preset table -->"


def methods_page(text: str) -> str:
    """``text`` (docs/methods.md) with the preset table between its markers replaced by the derived one."""
    from dllm_rl.rl.presets import methods_table

    if text.count(TABLE_BEGIN) != 1 or text.count(TABLE_END) != 1:
        raise SystemExit(f"docs/methods.md: needs one line {TABLE_BEGIN!r} and one {TABLE_END!r} around the table")
    head, rest = text.split(TABLE_BEGIN + "\n", 1)
    _, tail = rest.split(TABLE_END, 1)
    return head + TABLE_BEGIN + "\n" + "\n".join(methods_table()) + "\n" + TABLE_END + tail


def generated(root: Path = ROOT) -> dict[Path, str]:
    """Each generated file under ``root`` with the text it should hold."""
    # the package of this tree, whatever is installed (before anything imports dllm_rl)
    sys.path[:0] = [p for p in (str(root / "src"), str(root / "scripts")) if p not in sys.path]
    from config_reference import main as config_reference

    methods = root / "docs" / "methods.md"
    return {root / "docs" / "config.md": config_reference(), methods: methods_page(methods.read_text())}


def main(argv: list[str]) -> int:
    stale = []
    for path, text in generated().items():
        if path.read_text() != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if "--check" not in argv:
                path.write_text(text)
    if "--check" in argv and stale:
        print(f"stale: {', '.join(stale)}; run: make docs", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
