"""dllm-rl: reinforcement learning and SFT for diffusion language models.

The Python API (``docs/python.md``)::

    from dllm_rl import load_model, generate, RLTrainer, RLConfig, evaluate

Each public name is imported on first use (PEP 562 ``__getattr__``), so that ``import dllm_rl`` and
``dllm-rl --version`` import neither torch nor transformers (``tests/core/test_lazy_imports.py``).
"""

from __future__ import annotations

import importlib

from dllm_rl.version import __version__

#: public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    # models and decoding
    "load_model": "dllm_rl.api",
    "generate": "dllm_rl.api",
    "Engine": "dllm_rl.sampling.engine",
    "EngineConfig": "dllm_rl.sampling.engine",
    "DecodeConfig": "dllm_rl.sampling.config",
    "Rollout": "dllm_rl.sampling.rollout",
    # trainers and their configs
    "RLTrainer": "dllm_rl.api",
    "RLConfig": "dllm_rl.rl.config",
    "SFTTrainer": "dllm_rl.api",
    "SFTConfig": "dllm_rl.sft.config",
    "DPOTrainer": "dllm_rl.api",
    "DPOConfig": "dllm_rl.dpo.config",
    "load_config": "dllm_rl.config",
    # evaluation and tasks
    "evaluate": "dllm_rl.api",
    "Task": "dllm_rl.tasks",
    "Score": "dllm_rl.tasks",
    "get_task": "dllm_rl.tasks",
    "register_task": "dllm_rl.tasks",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dllm_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
