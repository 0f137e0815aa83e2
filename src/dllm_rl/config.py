"""Typed configuration: dataclasses loaded from YAML with ``a.b=c`` command-line overrides.

Every field is a dataclass field whose ``metadata["help"]`` says what it does (and, for a paper's knob,
the paper's name for it), following TRL's ``GRPOConfig``. Unknown keys are rejected with the closest
valid names; the resolved config is written next to every run (``save_config``) and reloads to an equal
object.

One file on purpose (about 400 lines): field declaration and checks, coercion of YAML / override values, the
bounded YAML reader and loading are one pipeline (a value is read, coerced and checked in one pass, and its
errors name the same key), and every layer imports it as the ground floor. The planned single configuration
model (issue 38, part 1) is the point at which to split it by job.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dllm_rl.errors import UserError

T = TypeVar("T")

#: what one YAML document may hold once its aliases are expanded (nodes), and how deep it may nest. A config is
#: a few hundred nodes a few levels deep; the bounds stop an alias bomb (nested anchors that expand to
#: gigabytes) and a document too deep for the composer's recursion before anything walks the expanded value.
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 100


def field(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
          ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
          choices: Any = None, check: Callable[[Any], str | None] | None = None):
    """A dataclass field with help text (shown by ``describe``) and the facts :func:`check_fields` checks:
    a numeric range (``ge`` / ``gt`` / ``le`` / ``lt``), the allowed values of a string field whose values
    come from a registry (``choices``: a container, or a function returning one, read when checked), or
    any other rule (``check(value)`` returns what is wrong, or None). ``Literal[...]`` annotations are
    checked too. ``None`` (an optional field left unset) is never checked."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "check": check}
    meta = {k: v for k, v in meta.items() if v is not None}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class ConfigError(UserError):
    """A bad key or value in a configuration (file, override or preset)."""


class FieldError(ConfigError):
    """A bad value of one field: ``key`` (a dotted path, completed by the enclosing sections) and what is
    wrong with it."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


def _range_problem(value: float, meta: Mapping[str, Any]) -> str | None:
    lo = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    hi = ("]", meta["le"]) if "le" in meta else (")", meta["lt"]) if "lt" in meta else None
    ok = ((lo is None or (value >= lo[1] if lo[0] == "[" else value > lo[1]))
          and (hi is None or (value <= hi[1] if hi[0] == "]" else value < hi[1])))
    if ok:
        return None
    if lo and hi:
        return f"must be in {lo[0]}{lo[1]}, {hi[1]}{hi[0]}, got {value}"
    op, bound = (">=" if lo[0] == "[" else ">", lo[1]) if lo else ("<=" if hi[0] == "]" else "<", hi[1])
    return f"must be {op} {bound}, got {value}"


def _finite_problem(value: Any) -> str | None:
    """What is wrong when a float value (or a float in a list of them) is NaN or infinite: no option of any
    config means anything at inf or NaN (``optim.lr=inf`` would train the weights to NaN), and NaN passes
    every range check (each comparison with it is false)."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    bad = next((v for v in items if isinstance(v, float) and not math.isfinite(v)), None)
    return None if bad is None else f"must be a finite number, got {bad}"


def allowed_values(tp: Any, meta: Mapping[str, Any]) -> tuple | None:
    """The values a field may take: its ``Literal`` arguments or its ``choices`` (None: any)."""
    tp, _ = _strip_optional(tp)
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    choices = meta.get("choices")
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices)


def check_fields(obj: Any) -> None:
    """Check every field of the dataclass instance ``obj`` against its annotation (``Literal``) and its
    metadata (see :func:`field`); raise :class:`FieldError` naming the first bad field. The one place
    where single-value facts of a config are checked (cross-field rules live with their config)."""
    types_ = _field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        allowed = allowed_values(types_[f.name], f.metadata)
        if allowed is not None and value not in allowed:
            raise FieldError(f.name, f"{value!r} is not allowed; choose one of {', '.join(map(str, allowed))}")
        problem = _finite_problem(value)
        if problem:
            raise FieldError(f.name, problem)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problem = _range_problem(value, f.metadata)
            if problem:
                raise FieldError(f.name, problem)
        check = f.metadata.get("check")
        problem = check(value) if check is not None else None
        if problem:
            raise FieldError(f.name, problem)


class Checked:
    """Base of a config dataclass that checks its fields at construction (:func:`check_fields`), so a
    config built in code fails as early as one loaded from YAML. Override ``__post_init__`` for
    cross-field rules and call ``super().__post_init__()`` first."""

    def __post_init__(self) -> None:
        check_fields(self)


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


def _to_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{where}: expected true/false, got {value!r}")


def _to_int(value: Any, where: str) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected an integer, got {value!r}") from None


def _to_float(value: Any, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a number, got {value!r}") from None


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: lambda value, where: str(value)}


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, before constructing any value, a document nested deeper than
    :data:`YAML_MAX_DEPTH`, one whose aliases expand past :data:`YAML_MAX_NODES` nodes, and an alias to a node
    that contains it (a self-referential value, which every walk of the config would recurse into forever)."""

    def compose_node(self, parent, index):
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise ConfigError(f"line {line}: nested deeper than {YAML_MAX_DEPTH} levels; a config is a few "
                                  "levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes of ``root`` with every alias expanded (a shared node counts once per use), without
    expanding anything: an iterative depth-first walk that sizes each distinct node once. Raises
    :class:`ConfigError` on a cycle or past :data:`YAML_MAX_NODES`."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the current path: an alias to one of them is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > YAML_MAX_NODES:
                raise ConfigError(f"line {node.start_mark.line + 1}: its aliases (*name) expand to more than "
                                  f"{YAML_MAX_NODES:,} values; write the values out instead of nesting anchors")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise ConfigError(f"line {node.start_mark.line + 1}: an alias (*name) refers to a value that contains "
                              "it (a self-referential value); write the value out")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def yaml_load(text: str | bytes, where: str) -> Any:
    """Parse YAML ``text`` (a file's bytes must be UTF-8) with the bounds of :class:`_BoundedLoader`; raises
    :class:`ConfigError` prefixed with ``where`` (a file name, or an override) on any problem. The one YAML
    reader for what a user writes: config files, ``key=value`` overrides, eval settings files and options."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = text[: exc.start].count(b"\n") + 1
            raise ConfigError(f"{where}: not UTF-8 text (byte {text[exc.start]:#04x} on line {line}); save the "
                              "file as UTF-8") from None
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({exc})") from None
    finally:
        loader.dispose()


def _to_sequence(value: Any, tp: Any, where: str) -> list | tuple:
    if isinstance(value, str):
        value = yaml_load(value, where) if value.strip().startswith("[") else [v for v in value.split(",") if v]
    if not isinstance(value, (list, tuple)):
        value = [value]
    (inner,) = typing.get_args(tp)[:1] or (Any,)
    items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    return items if _origin(tp) is list else tuple(items)


def _to_mapping(value: Any, where: str) -> dict:
    if isinstance(value, str):
        value = yaml_load(value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return dict(value)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from YAML or a string override) to the annotated type ``tp``. Values are not
    checked here (``Literal`` choices and ranges: :func:`check_fields`)."""
    tp, optional = _strip_optional(tp)
    if typing.get_origin(tp) is typing.Literal:
        if value in typing.get_args(tp):  # "none" may be a choice, not a null
            return value
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
    if origin in (list, tuple):
        return _to_sequence(value, tp, where)
    if origin is dict:
        return _to_mapping(value, where)
    convert = _SCALARS.get(tp)
    return convert(value, where) if convert is not None else value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a (nested) dict, rejecting unknown keys with suggestions and bad values
    (:func:`check_fields`) with the dotted key. ``where`` is the section's key ("config" at the top)."""
    types_ = _field_types(cls)
    unknown = [k for k in data if k not in types_]
    if unknown:
        valid = sorted(types_)
        prefix = "" if where == "config" else f"{where}: "
        raise ConfigError(f"{prefix}unknown key {unknown[0]!r}" + _suggest(unknown[0], valid))
    kwargs = {k: _coerce(v, types_[k], f"{where}.{k}" if where != "config" else k) for k, v in data.items()}
    try:
        obj = cls(**kwargs)
        if not isinstance(obj, Checked):
            check_fields(obj)
    except FieldError as exc:
        if where == "config":
            raise
        section = f"{where}." if where.replace(".", "").replace("_", "").isalnum() else f"{where}: "
        raise FieldError(section + exc.key, exc.problem) from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return obj


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
            node[part] = raw if not dataclasses.is_dataclass(tp) else yaml_load(raw, f"override {key!r}")
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
        loaded = yaml_load(p.read_bytes(), str(p)) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping")
        data = loaded
    for ov in overrides or []:
        apply_override(data, cls, ov)
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        if path is None:
            raise
        raise ConfigError(f"{path}: {exc}") from None


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
        allowed = allowed_values(_field_types(cls)[f.name], f.metadata)
        choices = f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else ""
        lines.append(f"{name} (default {default!r}): {f.metadata.get('help', '')}{choices}")
    return lines
