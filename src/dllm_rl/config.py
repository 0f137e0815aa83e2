"""Typed configuration: dataclasses loaded from YAML with ``a.b=c`` command-line overrides.

Every field is a dataclass field whose ``metadata["help"]`` says what it does (and, for a paper's knob,
the paper's name for it), following TRL's ``GRPOConfig``. Unknown keys are rejected with the closest
valid names; the resolved config is written next to every run (``save_config``) and reloads to an equal
object.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def field(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING):
    """A dataclass field with help text (shown by ``describe``)."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


class ConfigError(ValueError):
    """A bad key or value in a configuration (file, override or preset)."""


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"{hint} valid keys: {', '.join(valid)}"


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _origin(tp: Any) -> Any:
    """``typing.get_origin``, with a bare ``dict`` / ``list`` / ``tuple`` annotation as its own origin (it has no
    typing origin; it means ``dict[Any, Any]`` / ``list[Any]`` / ``tuple[Any, ...]``)."""
    return typing.get_origin(tp) or (tp if tp in (list, tuple, dict) else None)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from YAML or a string override) to the annotated type ``tp``."""
    tp, optional = _strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional or tp is Any:
            return None
        raise ConfigError(f"{where}: may not be null")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    origin = _origin(tp)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            value = [value]
        (inner,) = typing.get_args(tp)[:1] or (Any,)
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if tp is str:
        return str(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a (nested) dict, rejecting unknown keys with suggestions."""
    types_ = _field_types(cls)
    unknown = [k for k in data if k not in types_]
    if unknown:
        valid = sorted(types_)
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}" + _suggest(unknown[0], valid))
    kwargs = {k: _coerce(v, types_[k], f"{where}.{k}" if where != "config" else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def to_dict(obj: Any) -> Any:
    """Plain (YAML-safe) dict of a dataclass, recursively."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def apply_override(data: dict[str, Any], cls: type, override: str) -> None:
    """Apply one ``a.b=c`` override to the raw dict ``data`` of dataclass ``cls`` (validated later)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key=value (for example rl.beta=0.01)")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node, node_cls = data, cls
    for i, part in enumerate(parts):
        types_ = _field_types(node_cls)
        if part not in types_:
            where = ".".join(parts[:i]) or "config"
            raise ConfigError(f"override {key!r}: unknown key {part!r} in {where}" + _suggest(part, sorted(types_)))
        tp, _ = _strip_optional(types_[part])
        if i == len(parts) - 1:
            node[part] = raw if not dataclasses.is_dataclass(tp) else yaml.safe_load(raw)
            if isinstance(node[part], str) and tp not in (str, typing.Any) and _origin(tp) is None:
                node[part] = raw.strip()
        else:
            if not dataclasses.is_dataclass(tp):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = node.setdefault(part, {})
            node_cls = tp


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Read ``cls`` from a YAML file (optional) and apply ``a.b=c`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: config file not found")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML ({exc})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping")
        data = loaded
    for ov in overrides or []:
        apply_override(data, cls, ov)
    where = str(path) if path is not None else "config"
    try:
        return from_dict(cls, data, where if path is not None else "config")
    except ConfigError:
        raise


def save_config(obj: Any, path: str | Path) -> Path:
    """Write the resolved config as YAML."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(to_dict(obj), sort_keys=False))
    return p


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per field: ``name (type, default): help`` — used by ``--help-config``."""
    lines = []
    for f in dataclasses.fields(cls):
        tp, _ = _strip_optional(_field_types(cls)[f.name])
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            lines.append(f"{name}: {f.metadata.get('help', '')}")
            lines.extend(describe(tp, prefix=name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        lines.append(f"{name} (default {default!r}): {f.metadata.get('help', '')}")
    return lines
