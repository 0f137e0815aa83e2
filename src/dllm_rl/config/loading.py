"""Loading a config: values from YAML or ``a.b=c`` overrides coerced to the annotated types, built into the
dataclasses (unknown keys refused with the closest valid names), renamed keys carried to their new place with a
one-line deprecation, and the resolved config written back (``save_config``) to reload to an equal object."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dllm_rl.config.fields import (
    Checked,
    ConfigError,
    FieldError,
    check_fields,
    field_types,
    strip_optional,
    suggest,
    type_origin,
)
from dllm_rl.config.renames import carry_renamed, new_names, renamed_override
from dllm_rl.config.yaml_io import yaml_load

T = TypeVar("T")


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


def _to_sequence(value: Any, tp: Any, where: str) -> list | tuple:
    if isinstance(value, str):
        value = yaml_load(value, where) if value.strip().startswith("[") else [v for v in value.split(",") if v]
    if not isinstance(value, (list, tuple)):
        value = [value]
    (inner,) = typing.get_args(tp)[:1] or (Any,)
    items = [coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    return items if type_origin(tp) is list else tuple(items)


def _to_mapping(value: Any, where: str) -> dict:
    if isinstance(value, str):
        value = yaml_load(value, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return dict(value)


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert ``value`` (from YAML or a string override) to the annotated type ``tp``. Values are not
    checked here (``Literal`` choices and ranges: :func:`check_fields`)."""
    tp, optional = strip_optional(tp)
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
    origin = type_origin(tp)
    if origin in (list, tuple):
        return _to_sequence(value, tp, where)
    if origin is dict:
        return _to_mapping(value, where)
    convert = _SCALARS.get(tp)
    return convert(value, where) if convert is not None else value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a (nested) dict, rejecting unknown keys with suggestions and bad values
    (:func:`check_fields`) with the dotted key. ``where`` is the section's key ("config" at the top)."""
    types_ = field_types(cls)
    unknown = [k for k in data if k not in types_]
    if unknown:
        valid = sorted(types_)
        prefix = "" if where == "config" else f"{where}: "
        raise ConfigError(f"{prefix}unknown key {unknown[0]!r}" + suggest(unknown[0], valid, new_names(cls)))
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:  # one line naming the key, not the constructor's "missing 1 required positional argument"
        key = missing[0] if where == "config" else f"{where}.{missing[0]}"
        raise ConfigError(f"{key}: required, not given (set {key}=VALUE)")
    defaults = {f.name: f.default_factory() for f in dataclasses.fields(cls)
                if f.default_factory is not dataclasses.MISSING and isinstance(data.get(f.name), dict)}
    # a section given in part keeps the defaults of the section's default instance (RL's run.output_dir runs/rl)
    data = {k: _over(to_dict(defaults[k]), v) if k in defaults else v for k, v in data.items()}
    kwargs = {k: coerce(v, types_[k], f"{where}.{k}" if where != "config" else k) for k, v in data.items()}
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


def _over(base: Any, given: Any) -> Any:
    """``given`` laid over ``base``, nested mappings merged key by key."""
    if not (isinstance(base, dict) and isinstance(given, dict)):
        return given
    return {**base, **{k: _over(base.get(k), v) for k, v in given.items()}}


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
    if callable(obj) and hasattr(obj, "__qualname__"):  # a function given in Python (a reward): its 'module:name'
        return f"{obj.__module__}:{obj.__qualname__}"
    return obj


def apply_override(data: dict[str, Any], cls: type, override: str) -> None:
    """Apply one ``a.b=c`` override to the raw dict ``data`` of dataclass ``cls`` (validated later)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key=value (for example rl.beta=0.01)")
    key, raw = override.split("=", 1)
    key, raw = renamed_override(cls, key.strip(), raw)
    parts = key.split(".")
    node, node_cls = data, cls
    for i, part in enumerate(parts):
        types_ = field_types(node_cls)
        if part not in types_:
            where = ".".join(parts[:i]) or "config"
            raise ConfigError(f"override {key!r}: unknown key {part!r} in {where}"
                              + suggest(part, sorted(types_), new_names(cls) if i == 0 else None))
        tp, _ = strip_optional(types_[part])
        if i == len(parts) - 1:
            node[part] = raw if not dataclasses.is_dataclass(tp) else yaml_load(raw, f"override {key!r}")
            if isinstance(node[part], str) and tp not in (str, typing.Any) and type_origin(tp) is None:
                node[part] = raw.strip()
        else:
            if not dataclasses.is_dataclass(tp):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = node.setdefault(part, {})
            node_cls = tp


def as_overrides(cls: type, data: dict[str, Any], prefix: str = "") -> list[str]:
    """``data``, a mapping of ``cls``'s keys as a YAML config file holds them, as ``a.b=c`` overrides: a section
    is descended into, any other value is one override (a mapping or list in JSON, which YAML reads back), so
    that a file of settings can be laid over another config before the command line's own overrides."""
    types_ = field_types(cls)
    out: list[str] = []
    for key, value in data.items():
        tp = strip_optional(types_[key])[0] if key in types_ else None
        if isinstance(value, dict) and tp is not None and dataclasses.is_dataclass(tp):
            out += as_overrides(tp, value, f"{prefix}{key}.")
        else:  # an unknown key is left to apply_override, which names it with the closest valid ones
            text = value if isinstance(value, str) else json.dumps(value)
            out.append(f"{prefix}{key}={text}")
    return out


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
        data = carry_renamed(cls, loaded, str(p))
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


def load_command_config(cls: type[T], config: str | None, overrides: list[str], example: str) -> T:
    """The config of a command line ``COMMAND [CONFIG.yaml] [key=value ...]`` (``dllm-rl sft``, ``dllm-rl dpo``): a
    YAML file and / or overrides; a first word with ``=`` that is not a YAML file is an override. Neither is one
    line naming ``example``."""
    from dllm_rl.errors import UserError

    if config is None and not overrides:
        raise UserError(f"give a config file (e.g. {example}) and/or key=value overrides")
    overrides = list(overrides)
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config] + overrides
    return load_config(cls, config, overrides)
