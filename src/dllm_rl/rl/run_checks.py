"""The checks of an RL run's settings against the loaded model and the data, before the first rollout: the block
sizes, the sampler's settings of the rollouts and of the held-out evaluation, the estimator's options, and the
longest prompt with its completion slots against the model's context.

The config as given runs them when the trainer is built (:class:`~dllm_rl.rl.trainer.RLTrainer`), and every
curriculum stage runs the same checks on the config it would produce, with its own data
(:func:`dllm_rl.rl.curriculum.check_stages`), so a stage that cannot run is refused at the start, naming it, rather
than at its first rollout. Prompts with images are checked when they are encoded (their image positions are known
only then)."""

from __future__ import annotations

from typing import Any

from dllm_rl.config import ConfigError
from dllm_rl.errors import UserError
from dllm_rl.rl.algorithms import check_estimator_options
from dllm_rl.rl.config import decode_config

CHUNK = 1024  # prompts tokenized at a time (their ids are dropped once measured)


def longest_prompt(task: Any, tokenizer: Any) -> tuple[int, int] | None:
    """``(tokens, index)`` of the longest prompt of ``task`` as rollouts encode it (the built prompt through the
    tokenizer, no special tokens); None for a task with images or without examples."""
    if hasattr(task, "images") or len(task) == 0:
        return None
    best = (-1, -1)
    for start in range(0, len(task), CHUNK):
        texts = [task.build_prompt(task[i], tokenizer) for i in range(start, min(start + CHUNK, len(task)))]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        best = max(best, *((len(row), -(start + k)) for k, row in enumerate(ids)))  # the first of the longest
    return best[0], -best[1]


class PromptLengths:
    """The longest prompt of each task a run checks, measured once per task (the stages that keep the data share
    it with the config as given)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._seen: dict[int, tuple[Any, tuple[int, int] | None]] = {}  # id(task) -> (task, its longest prompt)

    def __call__(self, task: Any) -> tuple[int, int] | None:
        if id(task) not in self._seen:
            self._seen[id(task)] = (task, longest_prompt(task, self.tokenizer))
        return self._seen[id(task)][1]


def check_settings(cfg: Any, model: Any, lengths: PromptLengths, train_task: Any, eval_task: Any | None,
                   train_source: str | None = None) -> None:
    """Every check of ``cfg`` (an ``RLConfig``) against ``model`` (:func:`check_model_settings`) and the prompts of
    ``train_task`` and ``eval_task`` (:func:`check_prompts`); a :class:`ConfigError` naming the key."""
    check_model_settings(cfg, model)
    check_prompts(cfg, model, lengths, train_task, eval_task, train_source)


def check_model_settings(cfg: Any, model: Any) -> None:
    """The block sizes, the estimator's options and the sampler's settings of the rollouts and the held-out
    evaluation against ``model`` (no data needed: the trainer runs these before it reads any)."""
    from dllm_rl.rl.block_size import run_block_sizes
    from dllm_rl.sampling.inputs import check_config

    run_block_sizes(cfg, model.block_size)
    for evaluation in (False, True):
        decode = decode_config(cfg, model, evaluation=evaluation)
        try:
            check_config(model, decode)  # what the sampler refuses (e.g. a sub_block that does not divide)
        except UserError as exc:
            raise ConfigError(f"{'eval' if evaluation else 'rollout'}: {exc}") from None
    check_estimator_options(cfg, model)


def check_prompts(cfg: Any, model: Any, lengths: PromptLengths, train_task: Any, eval_task: Any | None,
                  train_source: str | None = None) -> None:
    """The longest prompt of ``train_task`` (and of ``eval_task``, decoded with the evaluation's settings) with its
    completion slots against the model's context. ``train_source``: where the training prompts come from in
    messages (default ``train_task.source``)."""
    from dllm_rl.sampling.inputs import check_config, check_fits

    for task, evaluation, what, source in ((train_task, False, "training", train_source),
                                           (eval_task, True, "held-out", None)):
        longest = lengths(task) if task is not None else None
        if longest is None:
            continue
        decode = decode_config(cfg, model, evaluation=evaluation)
        try:
            check_fits(model, decode, check_config(model, decode), longest[0],
                       f"the longest {what} prompt (item {longest[1]} of {source or task.source})")
        except UserError as exc:
            raise ConfigError(f"rollout.gen_length: {exc}") from None
