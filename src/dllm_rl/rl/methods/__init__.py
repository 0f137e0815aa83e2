"""The RL methods, one module each, and the tables every method draws from.

Each module declares ``METHOD = Method(...)`` (:mod:`dllm_rl.rl.method`: its preset, paper and recipe) and
registers the parts the library lacks (a policy loss, an advantage rule, a rollout hook; estimators live in
:mod:`dllm_rl.estimators`). Importing this package imports every module in it, so **adding a method** is one module
here and one recipe in ``configs/``: :data:`METHODS`, ``PRESETS``, the help texts, the preset table of
``docs/methods.md`` (``make docs``) and the tests' lists are derived from the modules.

The tables below are the complete registries (the config checks read them from here).
"""

from __future__ import annotations

import importlib
import pkgutil

from dllm_rl.estimators import ESTIMATORS
from dllm_rl.rl.advantages import ADVANTAGES
from dllm_rl.rl.hooks import ROLLOUT_HOOKS
from dllm_rl.rl.kl import KL_ESTIMATORS
from dllm_rl.rl.losses import POLICY_LOSSES
from dllm_rl.rl.method import Method


def _discover() -> dict[str, Method]:
    """Every module of this package, imported (which registers its parts), by its ``METHOD.name``."""
    found: dict[str, Method] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        method = getattr(module, "METHOD", None)
        if not isinstance(method, Method) or method.name != info.name:
            raise TypeError(f"{module.__name__} must declare METHOD = Method(name={info.name!r}, ...) "
                            f"(dllm_rl.rl.method)")
        found[method.name] = method
    return found


#: Every method, by name (its module's name), in alphabetical order.
METHODS: dict[str, Method] = _discover()

__all__ = ["ADVANTAGES", "ESTIMATORS", "KL_ESTIMATORS", "METHODS", "POLICY_LOSSES", "ROLLOUT_HOOKS"]
