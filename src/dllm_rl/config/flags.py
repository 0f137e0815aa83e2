"""A command's flags generated from its config dataclass (litgpt's rule: the signature is the CLI and the config):
one ``--flag`` per field, named after it (``num_samples`` -> ``--num-samples``), with the field's help, type, choices
and default; a bool is ``--flag / --no-flag``. Read back with :func:`given_values`."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from dllm_rl.config.fields import allowed_values, field_types, help_text, strip_optional

_SCALAR = (int, float, str)


def add_config_arguments(parser: Any, cls: type, *, exclude: tuple[str, ...] = (), dest_prefix: str = "",
                         with_defaults: bool = True, title: str | None = None,
                         aliases: Mapping[str, tuple[str, ...]] | None = None,
                         defaults: Any = None) -> None:
    """Add one flag per scalar field of dataclass ``cls`` (fields in ``exclude``, and mappings, lists and sections,
    are left to the caller). ``dest_prefix`` namespaces the parsed values (``decode_gen_length``); with
    ``with_defaults=False`` an unset flag stays None, so a caller can tell what the user gave. ``aliases``: more
    option strings of a field (``{"output_dir": ("-o", "--output")}``); ``defaults``: an instance whose values are
    the shown defaults (a section's default instance)."""
    group = parser.add_argument_group(title) if title else parser
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        tp, _ = strip_optional(types_[f.name])
        choices = allowed_values(types_[f.name], f.metadata)
        kind = str if choices else tp
        if f.name in exclude or (kind not in _SCALAR and kind is not bool):
            continue
        default = getattr(defaults, f.name) if defaults is not None else (
            f.default if f.default is not dataclasses.MISSING else None)
        text = help_text(f).replace("%", "%%")  # argparse %-formats help
        text += "" if default is None else f" (default: {default})"
        flags = ("--" + f.name.replace("_", "-"), *(aliases or {}).get(f.name, ()))
        value = default if with_defaults else None
        if kind is bool:
            group.add_argument(*flags, dest=dest_prefix + f.name, action=argparse.BooleanOptionalAction,
                               default=value, help=text)
        else:
            group.add_argument(*flags, dest=dest_prefix + f.name, type=kind, default=value,
                               choices=list(choices) if choices else None, metavar=f.name.upper(), help=text)


def given_values(args: argparse.Namespace, cls: type, dest_prefix: str = "") -> dict[str, Any]:
    """``{field: value}`` of the flags of ``cls`` the user gave (those added with ``with_defaults=False``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: value for key, value in vars(args).items()
            if key.startswith(dest_prefix) and (name := key[len(dest_prefix):]) in names and value is not None}


__all__ = ["add_config_arguments", "given_values"]
