"""``~`` in the paths a user gives (model, data, output directories): expanded once, where a trainer takes its
config, so that ``output_dir=~/runs/x`` lands in the home directory and not in a folder named ``~``, and so
that the saved ``config.yaml`` names the path that was used."""

from __future__ import annotations

import dataclasses
import os
from typing import TypeVar

T = TypeVar("T")


def expand_user(cfg: T, keys: tuple[str, ...]) -> T:
    """A copy of the dataclass ``cfg`` whose string fields at the dotted ``keys`` (``"eval.data"``) have a
    leading ``~`` expanded; other values (unset, hub ids, task names) are unchanged."""
    changes = {}
    for key in keys:
        head, _, rest = key.partition(".")
        value = changes.get(head, getattr(cfg, head))  # a section's earlier keys stay expanded
        if rest:
            new = expand_user(value, (rest,))
        else:
            new = os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value
        if new is not value:
            changes[head] = new
    if not changes:
        return cfg
    return dataclasses.replace(cfg, **changes)
