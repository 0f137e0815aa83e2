"""What a config holds, in words: ``--help-config`` lines (:func:`describe`)."""

from __future__ import annotations

import dataclasses

from dllm_rl.config.fields import allowed_values, field_types, strip_optional


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per field: ``name (type, default): help`` — used by ``--help-config``."""
    lines = []
    for f in dataclasses.fields(cls):
        tp, _ = strip_optional(field_types(cls)[f.name])
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            lines.append(f"{name}: {f.metadata.get('help', '')}")
            lines.extend(describe(tp, prefix=name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        allowed = allowed_values(field_types(cls)[f.name], f.metadata)
        choices = f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else ""
        lines.append(f"{name} (default {default!r}): {f.metadata.get('help', '')}{choices}")
    return lines
