"""One way to register a named part (estimator planner, policy loss, advantage rule, rollout hook): a decorator
that files a function under its name in that part's table, refusing a name registered twice (verl's
``core_algos`` registries, one table of names each)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def registrar(table: dict[str, Any], kind: str) -> Callable[[str], Callable[[F], F]]:
    """``register(name)`` for ``table``: ``@register("x")`` stores the decorated function as ``table["x"]``;
    a second registration of a name raises ``ValueError`` naming ``kind``."""

    def register(name: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            if name in table:
                raise ValueError(f"{kind} {name!r} registered twice")
            table[name] = fn
            return fn

        return deco

    return register
