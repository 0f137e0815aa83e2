"""What a config holds, in words: ``--help-config`` lines (:func:`describe`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dllm_rl.config.fields import allowed_values, field_types, strip_optional


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
            lines.append(f"{name}: {f.metadata.get('help', '')}")
            section = default if dataclasses.is_dataclass(default) else None
            lines.extend(describe(tp, prefix=name + ".", defaults=section))
            continue
        allowed = allowed_values(field_types(cls)[f.name], f.metadata)
        choices = f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else ""
        lines.append(f"{name} (default {default!r}): {f.metadata.get('help', '')}{choices}")
    return lines
