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


def countdown_root(root, families, train: int, test: int, **sizes):
    """``root`` with ``train`` / ``test`` Countdown rows (3 numbers up to 9; seeds 0 and 1) and, per family, a tiny
    checkpoint (seed 0) on the character tokenizer; ``sizes`` go to ``tiny_config`` (a callable value is called
    with the family, e.g. ``num_layers=lambda fam: ...``)."""
    from dllm_rl.jsonl import write_jsonl
    from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config
    from dllm_rl.tasks.synthetic import make_countdown

    write_jsonl(root / "train.jsonl", make_countdown(train, seed=0, numbers=3, max_value=9))
    write_jsonl(root / "test.jsonl", make_countdown(test, seed=1, numbers=3, max_value=9))
    tok = char_tokenizer()
    for fam in families:
        given = {k: v(fam) if callable(v) else v for k, v in sizes.items()}
        cfg = tiny_config(fam, vocab_size=len(tok), mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, **given)
        save_model(build_model(fam, cfg, seed=0), root / fam, tokenizer=tok)
    return root


def tiny_gemma(root):
    """``root / "diffusion_gemma"``: a tiny DiffusionGemma checkpoint (seed 0, two layers, canvas 4) on the character
    tokenizer, beside the Countdown rows of :func:`countdown_root`; returns ``root``."""
    from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config

    tok = char_tokenizer()
    cfg = tiny_config("diffusion_gemma", vocab_size=len(tok) + 3, hidden_size=16, intermediate_size=32, num_heads=2,
                      num_kv_heads=1, num_layers=2, block_size=4, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    save_model(build_model("diffusion_gemma", cfg, seed=0), root / "diffusion_gemma", tokenizer=tok)
    return root


def gemma_overrides(root, out, *extra: str) -> list[str]:
    """``rl_overrides`` for :func:`tiny_gemma`: one canvas of 4, 3 denoising steps, no masked-decoding key."""
    over = [o for o in rl_overrides(root, "diffusion_gemma", out) if not o.startswith("rollout.")]
    return [*over, "rollout.num_generations=4", "rollout.gen_length=4", "rollout.max_denoising_steps=3",
            "train.prompts_per_step=1", "train.micro_batch_size=8", *extra]
