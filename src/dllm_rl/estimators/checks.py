"""Validators of planner options: an option that is out of range raises ``ValueError`` naming it."""

from __future__ import annotations

import math
from typing import Any


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an integer (not a bool) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_unit_interval(name: str, value: Any, *, open_low: bool = False, open_high: bool = False) -> float:
    """``float(value)`` if it lies in ``[0, 1]`` (``open_low`` / ``open_high`` exclude an end)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}") from None
    if not (0.0 <= v <= 1.0) or math.isnan(v) or (open_low and v == 0.0) or (open_high and v == 1.0):
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise ValueError(f"{name} must be in {lo}0, 1{hi}, got {value!r}")
    return v
