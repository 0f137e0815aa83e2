"""Renamed config keys: an old key keeps working for one release, carried to its new place with a one-line
:class:`DeprecatedKey` warning naming the new key.

A top-level config class lists its renames in a ``RENAMED`` class attribute: ``{old dotted key: new dotted key}``,
or ``{old: (new, convert)}`` where the old key's values mean something else under the new name (``convert`` maps
an old value to the new one). An old key may name what is now a section (RL's ``model: PATH`` became
``model.path``): a scalar there is the old key, a mapping the new section. The same table upgrades a checkpoint's
saved ``config.yaml`` (silently), so a resume compares like with like.

A value may be renamed too: a field declared with ``renamed_values={old: new}`` (``model.dtype``'s ``bf16`` ->
``bfloat16``, SFT's ``model.tokenizer: auto`` -> null) reads the old spelling as the new one, with the same kind of
warning, from a YAML file, an override or flag, and a saved ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

from dllm_rl.config.fields import ConfigError, field_types, strip_optional


class DeprecatedKey(FutureWarning):
    """A config key that was renamed: it is read for one more release; the message names the new key."""


def renames(cls: type) -> dict[str, tuple[str, Callable[[Any], Any] | None]]:
    """``cls.RENAMED`` as ``{old: (new, convert or None)}``."""
    table = getattr(cls, "RENAMED", {})
    return {old: (spec, None) if isinstance(spec, str) else tuple(spec) for old, spec in table.items()}


def new_names(cls: type) -> dict[str, str]:
    """``{old key: new key}`` of ``cls``'s renames (for suggestions)."""
    return {old: new for old, (new, _) in renames(cls).items()}


def _is_section(cls: type, dotted: str) -> bool:
    """Whether ``dotted`` names a section (a nested dataclass) of ``cls``."""
    node = cls
    for part in dotted.split("."):
        types_ = field_types(node) if dataclasses.is_dataclass(node) else {}
        if part not in types_:
            return False
        node, _ = strip_optional(types_[part])
    return dataclasses.is_dataclass(node)


def _warn(old: str, new: str) -> None:
    warnings.warn(f"config key {old!r} is deprecated: use {new!r} (the old key is read until the next release)",
                  DeprecatedKey, stacklevel=4)


def _warn_value(key: str, old: Any, new: Any) -> None:
    shown = "null" if new is None else repr(new)
    warnings.warn(f"config value {key}: {old!r} is deprecated: use {shown} (the old value is read until the next "
                  "release)", DeprecatedKey, stacklevel=4)


def _renamed_value(f: dataclasses.Field, value: Any, key: str, warn: bool) -> tuple[bool, Any]:
    """``(True, new)`` when ``value`` is an old spelling of field ``f``'s values (warned unless ``warn`` is off)."""
    table = f.metadata.get("renamed_values") or {}
    if not isinstance(value, str) or value.strip() not in table:
        return False, value
    new = table[value.strip()]
    if warn:
        _warn_value(key, value, new)
    return True, new


def carry_renamed_values(cls: type, data: dict[str, Any], prefix: str = "", *, warn: bool = True) -> dict[str, Any]:
    """Replace every old spelling of a value in ``data`` (a raw config dict of ``cls``, keys already carried) by the
    current one, in place, sections descended into; warn once per value unless ``warn`` is off."""
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        tp, _ = strip_optional(types_[f.name])
        if dataclasses.is_dataclass(tp) and isinstance(data[f.name], dict):
            carry_renamed_values(tp, data[f.name], f"{prefix}{f.name}.", warn=warn)
        else:
            _, data[f.name] = _renamed_value(f, data[f.name], prefix + f.name, warn)
    return data


def _field_at(cls: type, dotted: str) -> dataclasses.Field | None:
    """The field dotted key ``dotted`` names in ``cls`` (None when there is none: the caller reports it)."""
    node, found = cls, None
    for part in dotted.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return None
        found = fields[part]
        node, _ = strip_optional(field_types(node)[part])
    return found


def _pop(data: dict, dotted: str) -> tuple[bool, Any]:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return False, None
    if last not in node:
        return False, None
    return True, node.pop(last)


def _put(data: dict, dotted: str, value: Any, old: str, where: str) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {part!r} must be a section (a mapping) to hold {dotted!r}")
    if last in node:
        raise ConfigError(f"{where}: both {old!r} (deprecated) and {dotted!r} are given; keep {dotted!r} only")
    node[last] = value


def carry_renamed(cls: type, data: dict[str, Any], where: str = "config", *, warn: bool = True) -> dict[str, Any]:
    """Move every old key of ``data`` (a raw config dict of ``cls``) to its new place and read every old spelling of
    a value as the current one (:func:`carry_renamed_values`), in place; warn once per key unless ``warn`` is off (a
    saved config.yaml). Returns ``data``."""
    for old, (new, convert) in renames(cls).items():
        *parents, last = old.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        if _is_section(cls, old) and isinstance(node[last], dict):  # the new section of the same name
            continue
        _, value = _pop(data, old)
        _put(data, new, convert(value) if convert else value, old, where)
        if warn:
            _warn(old, new)
    return carry_renamed_values(cls, data, warn=warn)


def renamed_override(cls: type, key: str, raw: str) -> tuple[str, str]:
    """The ``(key, value)`` an override ``key=raw`` stands for: an old key becomes its new one (warned; a value
    the new key reads differently converted). A mapping given for a key that is now a section is the section."""
    spec = renames(cls).get(key)
    if spec is not None and not (_is_section(cls, key) and raw.strip().startswith("{")):
        new, convert = spec
        _warn(key, new)
        key, raw = new, raw if convert is None else str(convert(raw))
    f = _field_at(cls, key)
    renamed, value = _renamed_value(f, raw, key, True) if f is not None else (False, raw)
    return key, ("null" if value is None else str(value)) if renamed else raw
