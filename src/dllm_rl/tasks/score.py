"""The reward value type: a ``float`` that carries why it was given."""

from __future__ import annotations

from typing import Any


def _make_score(value: float, reason: str, info: dict) -> Score:
    return Score(value, reason, **info)


class Score(float):
    """A reward value (a ``float``) that carries the reason it was given and optional extra info.

    >>> s = Score(0.0, "no <answer> tag")
    >>> float(s), s.reason
    (0.0, 'no <answer> tag')
    """

    __slots__ = ("reason", "info")
    reason: str
    info: dict[str, Any]

    def __new__(cls, value: float, reason: str = "", **info: Any) -> Score:
        obj = super().__new__(cls, value)
        obj.reason = reason
        obj.info = info
        return obj

    def __reduce__(self):
        return (_make_score, (float(self), self.reason, dict(self.info)))

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.info.items())
        return f"Score({float(self)!r}, {self.reason!r}{extra})"
