"""Declaring and checking config fields: :func:`field` (help text, ranges, choices, rules), :func:`check_fields`
and the :class:`Checked` base, and the errors every config step raises."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from dllm_rl.errors import UserError


def field(default: Any = dataclasses.MISSING, *, help: str | Callable[[], str],
          default_factory: Any = dataclasses.MISSING,
          ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
          choices: Any = None, check: Callable[[Any], str | None] | None = None,
          renamed_values: Mapping[str, Any] | None = None):
    """A dataclass field with help text (shown by ``describe``) and the facts :func:`check_fields` checks:
    a numeric range (``ge`` / ``gt`` / ``le`` / ``lt``), the allowed values of a string field whose values
    come from a registry (``choices``: a container, or a function returning one, read when checked), or
    any other rule (``check(value)`` returns what is wrong, or None). ``Literal[...]`` annotations are
    checked too. ``None`` (an optional field left unset) is never checked. ``help`` may be a function returning
    the text, read when shown (:func:`help_text`). ``renamed_values`` maps old spellings of a value to the
    current one (``{"bf16": "bfloat16"}``), read with a deprecation (:mod:`dllm_rl.config.renames`)."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "check": check,
            "renamed_values": renamed_values}
    meta = {k: v for k, v in meta.items() if v is not None}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def help_text(f: dataclasses.Field) -> str:
    """The help text of config field ``f`` (its ``help``, called when it is a function)."""
    text = f.metadata.get("help", "")
    return text() if callable(text) else text


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
    tp, _ = strip_optional(tp)
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    choices = meta.get("choices")
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices)


def _type_problem(value: Any, tp: Any) -> str | None:
    """What is wrong when ``value`` is not of a scalar or section annotation ``tp``, worded as
    :func:`~dllm_rl.config.loading.coerce` words it (a config built in code is not coerced: ``temperature="hot"``
    would fail deep in the sampler). Numbers by the ``numbers`` ABCs, so numpy's pass; a bool is no number here.
    Other annotations (strings, which a path may stand for; unions, containers, ``Any``) are not checked."""
    tp, _ = strip_optional(tp)
    if tp in (int, float):
        kind = numbers.Integral if tp is int else numbers.Real
        ok = isinstance(value, kind) and not isinstance(value, bool)
        return None if ok else f"expected {'an integer' if tp is int else 'a number'}, got {value!r}"
    if tp is bool and not isinstance(value, bool):
        return f"expected true/false, got {value!r}"
    if dataclasses.is_dataclass(tp) and isinstance(tp, type) and not isinstance(value, tp):
        return f"expected a {tp.__name__} (a mapping in YAML), got {value!r}"
    return None


def check_fields(obj: Any) -> None:
    """Check every field of the dataclass instance ``obj`` against its annotation (``Literal``) and its
    metadata (see :func:`field`); raise :class:`FieldError` naming the first bad field. The one place
    where single-value facts of a config are checked (cross-field rules live with their config)."""
    types_ = field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        problem = _type_problem(value, types_[f.name])
        if problem:
            raise FieldError(f.name, problem)
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


def suggest(key: str, valid: list[str], renamed: Mapping[str, str] | None = None) -> str:
    """``; did you mean ...? valid keys: ...`` for an unknown ``key``; a close old key of ``renamed`` (old -> new)
    suggests its new name (``num_generation`` -> ``rollout.num_generations``)."""
    names = {**{old: new for old, new in (renamed or {}).items() if "." not in old}, **{v: v for v in valid}}
    close = difflib.get_close_matches(key, list(names), n=3, cutoff=0.5)
    close = list(dict.fromkeys(names[c] for c in close))
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"{hint} valid keys: {', '.join(valid)}"


@functools.cache
def field_types(cls: type) -> Mapping[str, Any]:
    """Field name -> its evaluated annotation, read-only. Evaluated once per class: ``typing.get_type_hints`` of
    the config classes cost about half a CPU-second per loaded RL config (every test run loads several)."""
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


def type_origin(tp: Any) -> Any:
    """``typing.get_origin``, with a bare ``dict`` / ``list`` / ``tuple`` annotation as its own type_origin (it has no
    typing type_origin; it means ``dict[Any, Any]`` / ``list[Any]`` / ``tuple[Any, ...]``)."""
    return typing.get_origin(tp) or (tp if tp in (list, tuple, dict) else None)


def strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False
