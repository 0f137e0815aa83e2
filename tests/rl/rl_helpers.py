"""Helpers for the RL trainer tests (imported by name; pytest's conftest holds only fixtures)."""

from __future__ import annotations

import pytest

from dllm_rl.rl.rollout_copy import cxx_compiler

# torch.compile on CPU builds C++ kernels; `make test` installs g++ (`make cxx`) when it can
needs_cxx = pytest.mark.skipif(cxx_compiler() is None,
                               reason="no C++ compiler for torch.compile (`make cxx` installs g++)")


def digit_reward(prompts, completions, **columns):
    """A dense test reward: the fraction of digit characters in the completion (varies between samples)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def alternating_reward(prompts, completions, **columns):
    """1, 0, 1, 0, ... whatever the completions say: every group of an even size has reward signal (the tiny image
    models' completions are often empty or digit-free)."""
    return [float(i % 2 == 0) for i in range(len(completions))]


def rl_overrides(root, family: str, out, *extra: str) -> list[str]:
    return [f"model.path={root / family}", "data.task=countdown", f"data.train_file={root / 'train.jsonl'}",
            f"eval.data={root / 'test.jsonl'}", "data.prompt_style=compact", "train.prompts_per_step=2",
            "rollout.num_generations=4",
            "rollout.gen_length=8", "rollout.block_length=8", "eval.limit=0", f"run.output_dir={out}",
            "run.progress=false", "log.samples_every=0", "optim.lr=0.003", "model.device=cpu", "log.dashboard=false",
            *extra]


def image_overrides(root, family: str, out, *extra: str) -> list[str]:
    """An RL run on the shapes task of ``image_rl_setup`` (tests/rl/conftest.py)."""
    return [f"model.path={root / family}", "data.task=shapes", f"data.train_file={root / 'train.jsonl'}",
            f"eval.data={root / 'test.jsonl'}", "data.prompt_style=compact", "train.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.gen_length=4", "rollout.block_length=4", "eval.limit=2", f"run.output_dir={out}",
            "run.progress=false", "log.samples_every=0", "optim.lr=0.003", "model.device=cpu",
            "drop_zero_variance=false", "log.dashboard=false", *extra]
