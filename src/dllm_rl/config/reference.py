"""What a config holds, in words: ``--help-config`` lines (:func:`describe`) and the Markdown reference of every
command's configuration (:func:`markdown`, written to ``docs/config.md`` by ``scripts/config_reference.py`` and
checked against it by a test)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from dllm_rl.config.fields import allowed_values, field_types, help_text, strip_optional


def _default(f: dataclasses.Field, defaults: Any) -> Any:
    """A field's default: its value in ``defaults`` (the enclosing section's default instance, which may differ
    from the class's: RL's ``run.output_dir`` is runs/rl), else the declared one ("required" when none)."""
    if defaults is not None:
        return getattr(defaults, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else "required"


def describe(cls: type, prefix: str = "", defaults: Any = None) -> list[str]:
    """One line per field: ``name (default ...): help`` — used by ``--help-config``."""
    lines = []
    for f in dataclasses.fields(cls):
        tp, _ = strip_optional(field_types(cls)[f.name])
        name = f"{prefix}{f.name}"
        default = _default(f, defaults)
        if dataclasses.is_dataclass(tp):
            lines.append(f"{name}: {help_text(f)}")
            section = default if dataclasses.is_dataclass(default) else None
            lines.extend(describe(tp, prefix=name + ".", defaults=section))
            continue
        allowed = allowed_values(field_types(cls)[f.name], f.metadata)
        choices = f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else ""
        lines.append(f"{name} (default {default!r}): {help_text(f)}{choices}")
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(sections: list[tuple[str, type, Any]]) -> str:
    """The reference page: for each ``(title, config class, default instance or None)`` one table of every key,
    its default and its help, in declaration order; renamed keys listed under their new names."""
    out = ["# Configuration reference", "",
           "Generated from the config dataclasses by `make docs` (`scripts/config_reference.py`; a test "
           "checks it is current). Every key is also listed by `dllm-rl COMMAND --help-config` (one section: "
           "`--help-config SECTION`). Every command (`rl`, `demo`, `sft`, `dpo`, `pairs`, `eval`, `trace`, `plot`, "
           "`generate`, `serve`, `info`, `data make|show|sandbox`) reads `[CONFIG.yaml] [key=value ...] [--key value "
           "...]` (`eval`, `trace`, `generate`, `serve` and `info` take the model directory as a first word too, "
           "`plot` its runs): every key is also a flag, named after it (`train.max_steps` -> `--train.max-steps "
           "VALUE`; a bool `--key` / `--no-key`, in a section `--run.no-progress`; a list repeatable, a list of "
           "numbers also `0.5,0.7`; a mapping `KEY=VALUE` items, repeatable), applied after the YAML and the "
           "overrides; `--help` lists the command's own keys, `model.` and `run.`, and one line per other section.", ""]
    for title, cls, defaults in sections:
        out += [f"## {title}", "", (cls.__doc__ or "").strip().replace("\n    ", " "), "",
                "| key | default | what it does |", "|---|---|---|"]
        for line in describe(cls, defaults=defaults):
            key, _, rest = line.partition(" (default ")
            if not rest:  # a section line: "name: help"
                name, _, help_ = line.partition(": ")
                out.append(f"| **{_cell(name)}** | | {_cell(help_)} |")
                continue
            default, _, help_ = rest.partition("): ")
            out.append(f"| `{_cell(key)}` | `{_cell(default)}` | {_cell(help_)} |")
        renamed = getattr(cls, "RENAMED", {})
        if renamed:
            pairs = ", ".join(f"`{old}` → `{new if isinstance(new, str) else new[0]}`" for old, new in renamed.items())
            out += ["", f"Keys of earlier releases, still read with a one-line deprecation warning: {pairs}."]
        keys_of: dict[str, list[str]] = {}  # the keys sharing one table named together
        for key, table in _renamed_values(cls):
            words = ", ".join(f"`{old}` → `{'null' if new is None else new}`" for old, new in table.items())
            keys_of.setdefault(words, []).append(f"`{key}`")
        values = "; ".join(f"{', '.join(keys)}: {words}" for words, keys in keys_of.items())
        if values:
            out += ["", f"Values of earlier releases, still read with a one-line deprecation warning: {values}."]
        out.append("")
    return "\n".join(out)


def _renamed_values(cls: type, prefix: str = "") -> list[tuple[str, dict]]:
    """``(dotted key, {old value: new value})`` of every field of ``cls`` declared with ``renamed_values``."""
    out = []
    for f in dataclasses.fields(cls):
        tp, _ = strip_optional(field_types(cls)[f.name])
        if dataclasses.is_dataclass(tp):
            out += _renamed_values(tp, f"{prefix}{f.name}.")
        elif f.metadata.get("renamed_values"):
            out.append((prefix + f.name, dict(f.metadata["renamed_values"])))
    return out


def help_config_argument(parser: Any, lines: Callable[[], list[str]]) -> None:
    """Add ``--help-config [SECTION]`` to a command's ``parser``: it prints ``lines()`` (every key of the command's
    config, with its default and help; with SECTION, those of that section) and exits 0, before the command's
    required arguments are checked (as ``--help`` does)."""
    import argparse

    class _HelpConfig(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            shown = lines()
            # a word that cannot be a section (a YAML, an override, a path) is the command line's, not SECTION's
            if values and re.fullmatch(r"\w+(\.\w+)*", values) and not values.endswith((".yaml", ".yml")):
                shown = [line for line in shown if line.startswith((f"{values}.", f"{values}:"))]
                if not shown:
                    sections = [line.partition(":")[0] for line in lines() if re.match(r"[\w]+: ", line)]
                    parser.error(f"--help-config {values}: no such section (sections: {', '.join(sections)})")
            print("\n".join(shown))
            parser.exit(0)

    parser.add_argument("--help-config", nargs="?", const="", metavar="SECTION", action=_HelpConfig,
                        help="list every config key (or those of SECTION) with its default and help, and exit "
                        "(docs/config.md lists them too)")
