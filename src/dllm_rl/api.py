"""The Python API: the commands' code paths, called from Python (``docs/python.md``).

Nothing here is a second implementation. :func:`load_model` and :func:`generate` are ``dllm-rl generate``'s steps;
``RLTrainer(cfg).train()`` is ``dllm-rl rl``'s run (:func:`dllm_rl.rl.loop.run`), and likewise :class:`SFTTrainer`
and :class:`DPOTrainer`; :func:`evaluate` builds the :class:`~dllm_rl.eval.harness.EvalRunConfig` that ``dllm-rl
eval`` builds and runs the same harness, so it writes and returns the same numbers.

What Python adds to the configs is objects where a YAML file holds names:

- a reward function (TRL's signature ``(prompts, completions, **columns) -> list[float]``) wherever a config takes
  ``module:function``: ``reward.function``, a ``reward.terms`` entry's ``task``, or the trainers'
  ``reward_funcs=`` (one function: ``reward.function``; several, or with ``reward_weights=``: ``reward.terms``).
  The run's ``config.yaml`` records it by its ``module:function`` name;
- a task class (a :class:`~dllm_rl.tasks.Task` subclass, or any callable that builds one from
  ``get_task``'s options) wherever a config names a task: it is registered under its ``name``
  (:func:`~dllm_rl.tasks.register_task`) and the config names it, so the trainer builds its training and held-out
  sets from it as from a built-in task. :func:`evaluate` also takes a task object, evaluated as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dllm_rl.config import ConfigError, load_config
from dllm_rl.dpo import trainer as dpo_trainer
from dllm_rl.dpo.config import DPOConfig
from dllm_rl.errors import UserError
from dllm_rl.rewards.reward_terms import RewardTerm
from dllm_rl.rl import loop as rl_loop
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.trainer import RLTrainer as _RLTrainer
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.sampling.rollout import Rollout
from dllm_rl.sft import trainer as sft_trainer
from dllm_rl.sft.config import SFTConfig
from dllm_rl.tasks import Task, list_tasks, register_task, task_factory, unregister_task

__all__ = ["DPOTrainer", "RLTrainer", "SFTTrainer", "evaluate", "generate", "load_model"]

C = TypeVar("C")
Reward = Callable[..., Sequence[Any]] | str


# ------------------------------------------------------------------------------------------------ configs
def _config(cls: type[C], config: C | str | Path | None, overrides: Sequence[str]) -> C:
    """``config`` as a ``cls``: the object itself, or a YAML file (None: the defaults) with ``a.b=c`` overrides laid
    over it, loaded as the command loads it."""
    if isinstance(config, cls):
        if overrides:
            raise UserError(f"overrides {list(overrides)} are laid over a YAML file or the defaults; change a "
                            f"{cls.__name__} with dataclasses.replace")
        return config
    if config is not None and not isinstance(config, str | Path):
        raise TypeError(f"config must be a {cls.__name__}, a YAML file or None, got {type(config).__name__}")
    return load_config(cls, config, list(overrides))


def task_name(task: str | type[Task] | Callable[..., Task]) -> str:
    """The name a config gives ``task``: a name as it is; a task class (or factory) registered under its ``name``
    (a class's ``name`` attribute, else the function's name). A name that another task holds is refused: a
    subclass of a built-in task needs its own ``name``."""
    if isinstance(task, str):
        return task
    if isinstance(task, Task):
        raise UserError(f"task {task.name!r} is a Task object; a trainer builds its training and held-out sets "
                        f"itself: pass the class ({type(task).__name__}), with data.train_file / eval.data")
    if not callable(task):
        raise TypeError(f"task must be a name, a Task class or a function building one, got {type(task).__name__}")
    name = getattr(task, "name", None) if isinstance(task, type) else getattr(task, "__name__", None)
    if not isinstance(name, str) or not name:
        raise UserError(f"task {task!r}: give it a name (a class attribute name = '...')")
    held = task_factory(name)
    if held is not None and held is not task:
        raise UserError(f"task {getattr(task, '__qualname__', task)!r}: the name {name!r} is taken by another task "
                        f"({', '.join(list_tasks())} are); give the class its own name = '...'")
    register_task(name, task)
    return name


def with_rewards(cfg: RLConfig, reward_funcs: Reward | Sequence[Reward] | None,
                 reward_weights: Sequence[float] | None = None) -> RLConfig:
    """``cfg`` with TRL's ``reward_funcs`` / ``reward_weights`` in its ``reward`` section: one function without
    weights is ``reward.function`` (it replaces the task's reward); several, or weighted, are ``reward.terms``
    (a weighted sum, each logged as ``reward_NAME``). The section's own checks apply."""
    if reward_funcs is None:
        if reward_weights is not None:
            raise ConfigError("reward_weights: given without reward_funcs")
        return cfg
    funcs = [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) else list(reward_funcs)
    if reward_weights is None and len(funcs) == 1:
        reward = dataclasses.replace(cfg.reward, function=funcs[0])
    else:
        weights = [1.0] * len(funcs) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(funcs):
            raise ConfigError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward functions")
        reward = dataclasses.replace(cfg.reward, terms=[RewardTerm(task=f, weight=w) for f, w in zip(funcs, weights)])
    return dataclasses.replace(cfg, reward=reward)


# ------------------------------------------------------------------------------------------------ trainers
class RLTrainer(_RLTrainer):
    """``dllm-rl rl`` from Python: ``RLTrainer(RLConfig(...)).train()`` runs the command's loop and returns its
    summary (held-out accuracy before and after, minutes, the final model's directory).

    ``config``: an :class:`RLConfig`, a YAML file or None (the defaults), with ``overrides`` (``a.b=c``) laid over
    a file or the defaults. ``reward_funcs`` / ``reward_weights``: TRL's reward functions (:func:`with_rewards`).
    ``task``: a task name or class for ``data.task`` (:func:`task_name`). Built as the command builds it: the
    model, tasks and optimiser are ready when the constructor returns (``.model``, ``.step()``, ``.evaluate()``).
    """

    def __init__(self, config: RLConfig | str | Path | None = None, *, overrides: Sequence[str] = (),
                 reward_funcs: Reward | Sequence[Reward] | None = None,
                 reward_weights: Sequence[float] | None = None, task: str | type[Task] | None = None):
        cfg = with_rewards(_config(RLConfig, config, overrides), reward_funcs, reward_weights)
        if task is not None:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, task=task_name(task)))
        super().__init__(cfg)

    def train(self) -> dict:
        """Run to ``train.max_steps`` (as ``dllm-rl rl``); the trainer is closed after it."""
        return rl_loop.run(self)


class SFTTrainer(sft_trainer.SFTTrainer):
    """``dllm-rl sft`` from Python: ``SFTTrainer(SFTConfig(...)).train()`` runs the command's loop and returns its
    :class:`~dllm_rl.sft.trainer.SFTResult` (steps, last loss, the model's directory). ``config`` and ``overrides``
    as for :class:`RLTrainer`."""

    def __init__(self, config: SFTConfig | str | Path | None = None, *, overrides: Sequence[str] = (),
                 verbose: bool = True):
        super().__init__(_config(SFTConfig, config, overrides), verbose=verbose)

    def train(self) -> sft_trainer.SFTResult:
        """Run to ``train.max_steps`` (as ``dllm-rl sft``); the trainer is closed after it."""
        return sft_trainer.run(self)


class DPOTrainer(dpo_trainer.DPOTrainer):
    """``dllm-rl dpo`` from Python (VRPO preference training): ``DPOTrainer(DPOConfig(...)).train()``; ``config``
    and ``overrides`` as for :class:`RLTrainer`."""

    def __init__(self, config: DPOConfig | str | Path | None = None, *, overrides: Sequence[str] = (),
                 verbose: bool = True):
        super().__init__(_config(DPOConfig, config, overrides), verbose=verbose)

    def train(self) -> sft_trainer.SFTResult:
        """Run to ``train.max_steps`` (as ``dllm-rl dpo``); the trainer is closed after it."""
        return dpo_trainer.run(self)


# ------------------------------------------------------------------------------------------------ decoding
def load_model(path: str | Path, *, device: str = "auto", dtype: str = "auto", tokenizer: str | Path | None = None):
    """A checkpoint directory or hub id ``org/name[@revision]`` as a :class:`~dllm_rl.models.DiffusionLM`, in eval
    mode, with its tokenizer as ``model.tokenizer`` (from ``tokenizer``, default the checkpoint's) and its source as
    ``model.source`` (what :func:`evaluate` records). ``device``: auto | cpu | cuda | cuda:N; ``dtype``: auto
    (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16."""
    from dllm_rl.models import load_model as load
    from dllm_rl.models import load_tokenizer
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.threads import use_cpu_threads

    dev = resolve_device(device)
    model = load(path, dtype=resolve_eval_dtype(dtype, dev), device=dev, tokenizer_dir=tokenizer)
    use_cpu_threads(dev)
    model.tokenizer = load_tokenizer(tokenizer or path, mask_token_id=model.mask_token_id,
                                     noise=model.family.noise)
    model.source = str(path)
    return model.eval()


def generate(model, prompts: str | Sequence[str] | Sequence[Sequence[int]], config: DecodeConfig | None = None, *,
             tokenizer=None, chat: bool = False, batch_size: int = 32, slots: int | None = None,
             **decode: Any) -> Rollout:
    """Decode a completion of each prompt, as ``dllm-rl generate`` does; returns the :class:`Rollout`
    (``.texts``, ``.step_map``, ``.nfe``, ``.finish_reason``).

    ``prompts``: texts (encoded as they are, or as one user message through the chat template with ``chat``) or
    token ids: a string, a list of strings, a list of token ids or a list of lists of token ids (anything else, a mix
    or a non-integer id, is a UserError). ``config`` or the :class:`DecodeConfig` fields as keywords
    (``gen_length=64, threshold=0.9``).
    ``slots``: decode with the continuous-batching engine, that many sequences at a time (same tokens).
    ``tokenizer``: default ``model.tokenizer`` (:func:`load_model`)."""
    from dllm_rl.config import from_dict
    from dllm_rl.models.tokenizer import encode_prompts
    from dllm_rl.sampling.batched import generate_batched
    from dllm_rl.sampling.engine import EngineConfig
    from dllm_rl.sampling.inputs import split_prompts

    if config is not None and decode:
        raise UserError(f"give the decoding as config or as keywords ({', '.join(decode)}), not both")
    # keywords read as a YAML section is (dllm_rl.config.from_dict): an unknown one is a ConfigError with suggestions
    config = config if config is not None else from_dict(DecodeConfig, decode, "decode")
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    prompts, texts = split_prompts(prompts)  # the shapes; check_inputs checks each prompt's ids
    if texts:
        if tokenizer is None:
            raise UserError("text prompts need a tokenizer: load the model with dllm_rl.load_model or pass tokenizer=")
        prompts = encode_prompts(tokenizer, prompts, chat, getattr(model, "source", "the model"))
    return generate_batched(model, prompts, config, tokenizer=tokenizer, batch_size=batch_size,
                            engine=EngineConfig(slots=slots) if slots is not None else None)


# ------------------------------------------------------------------------------------------------ evaluation
@contextlib.contextmanager
def _task_for_eval(task: str | Task | type[Task] | Callable[..., Task]) -> Iterator[str]:
    """The name an evaluation's config gives ``task``; a Task object is registered under its name for the
    evaluation only (then the registry is as it was), so that a built-in task's object is evaluated as built."""
    if not isinstance(task, Task):
        yield task_name(task)
        return
    held = task_factory(task.name)
    register_task(task.name, lambda **_options: task)
    try:
        yield task.name
    finally:
        if held is None:
            unregister_task(task.name)
        else:
            register_task(task.name, held)


def evaluate(model, task: str | Task | type[Task], *, output_dir: str | Path | None = None,
             settings: Sequence[str] = (), log: Callable[[str], None] | None = None, **options: Any) -> dict:
    """Evaluate ``model`` on ``task`` as ``dllm-rl eval`` does (the same harness, files and numbers); returns the
    summary (``summary["settings"][NAME]["metrics"]["accuracy"]``, NFE, lengths, pass@k).

    ``model``: a checkpoint directory or hub id, or a model from :func:`load_model` (decoded as it is in memory;
    its source names the tokenizer and the record). ``task``: a name, a task class, or a Task object (evaluated as
    built: its data, split and limit). ``settings``: ``--setting`` strings (``"dyn:threshold=0.9"``). ``options``:
    the command's flags as keywords: :class:`~dllm_rl.eval.harness.EvalRunConfig` fields (``limit``, ``split``,
    ``num_samples``, ...), the run section's (``seed``, ``overwrite``, ``progress``) and :class:`DecodeConfig`
    fields (the base of every setting). ``output_dir``: default ``runs/eval/MODEL-TASK-SPLIT``, as the command's."""
    from dllm_rl.config import from_dict
    from dllm_rl.config.vocabulary import ModelSection
    from dllm_rl.eval.harness import EvalRunConfig, run_eval
    from dllm_rl.training.run_config import RunConfig

    loaded = None if isinstance(model, str | Path) else model
    model_dir = str(model) if loaded is None else getattr(loaded, "source", None)
    if model_dir is None:
        raise UserError("evaluate: give a checkpoint directory, or a model loaded with dllm_rl.load_model")
    sections = {"model", "task", "run", "decode", "setting"}
    fields = {f.name for f in dataclasses.fields(EvalRunConfig)} - sections
    model_keys, run_keys = {"tokenizer", "dtype", "device"}, {"seed", "overwrite", "progress"}
    given = {k: v for k, v in options.items() if k in fields}
    run = {k: v for k, v in options.items() if k in run_keys}
    section = ModelSection(path=model_dir, **{k: v for k, v in options.items() if k in model_keys})
    decode = {k: v for k, v in options.items() if k not in fields | run_keys | model_keys}
    with _task_for_eval(task) as name:
        split = given.get("split", "test")
        out = output_dir or Path("runs") / "eval" / f"{Path(model_dir).resolve().name}-{Path(name).stem}-{split}"
        cfg = EvalRunConfig(model=section, task=name, decode=from_dict(DecodeConfig, decode, "decode"),
                            run=RunConfig(output_dir=str(out), **run), setting=list(settings), **given)
        return run_eval(cfg, model=loaded, log=log)
