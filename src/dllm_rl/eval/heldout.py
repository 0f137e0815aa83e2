"""In-memory held-out accuracy: decode a task's prompts with a model already in memory and score them.

The evaluation loop of training runs (the RL trainer before, during and after training). ``dllm-rl eval``
(:mod:`dllm_rl.eval.harness`) is the file-based, resumable evaluation of saved checkpoints over several decoding
settings (``--demo``: the shipped demo checkpoints as ``make demo`` reports them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_rl.models.image_inputs import PromptEncoder
from dllm_rl.sampling import DecodeConfig, generate_batched
from dllm_rl.sampling.decode import evaluating
from dllm_rl.seeding import derive_seed
from dllm_rl.tasks.base import DataError


@dataclass
class HeldOut:
    accuracy: float
    reward: float
    mean_length: float
    nfe_per_token: float
    n: int
    nfe_mean: float = 0.0
    texts: list[str] = field(default_factory=list)  # the decoded completions, in example order
    scores: list[Any] = field(default_factory=list)  # the task's scores (float-like, with ``.reason``)

    @property
    def tokens_per_nfe(self) -> float:
        """Answer tokens per forward pass (tokens per forward, TPF): how parallel the decoding was."""
        return 1.0 / self.nfe_per_token if self.nfe_per_token else 0.0

    def metrics(self, prefix: str = "eval_") -> dict[str, float]:
        """What a run logs of it: accuracy, reward, forward passes per answer (``nfe``) and tokens per forward
        (``tpf``), each under ``prefix``."""
        return {f"{prefix}accuracy": self.accuracy, f"{prefix}reward": self.reward, f"{prefix}nfe": self.nfe_mean,
                f"{prefix}tpf": self.tokens_per_nfe}


def check_not_empty(task: Any, what: str, key: str) -> None:
    """Refuse a task without examples, naming its file and the key that chose it (an evaluation of no items
    would report an accuracy of 0)."""
    if len(task) == 0:
        raise DataError(f"{task.source}: no {what} examples ({key}); give a file with at least one item"
                        + (" or eval.limit=0 to turn the held-out evaluation off" if key == "eval.data" else ""))


@torch.no_grad()
def heldout_accuracy(model, tokenizer, task, examples: list[dict], decode: DecodeConfig, batch_size: int = 64,
                     seed: int = 0, prompts: Any = None, engine: Any = None) -> HeldOut:
    """Decode every example once with ``decode`` (greedy by default) and score it with the task's reward.

    ``examples`` may be empty (a rank's share of fewer items than ranks): the result then counts 0 items;
    an empty task is refused before (:func:`check_not_empty`). ``prompts`` (a
    :class:`~dllm_rl.models.image_inputs.PromptEncoder`, default one without a model directory) gives the
    prompts' ids and, for an image task, their images. ``engine`` (an
    :class:`~dllm_rl.sampling.engine.EngineConfig`): decode with the continuous-batching engine (same tokens)."""
    if not examples:
        return HeldOut(0.0, 0.0, 0.0, 0.0, 0)
    prompts = prompts if prompts is not None else PromptEncoder(tokenizer)
    with evaluating(model):
        _, ids, images = prompts.task_prompts(model, task, examples)
        seeds = [derive_seed(seed, i) for i in range(len(ids))]
        rollout = generate_batched(model, ids, decode, seeds=seeds, tokenizer=tokenizer, batch_size=batch_size,
                                   images=images, engine=engine)
    scores = task.score_examples(rollout.texts, examples)
    metrics = task.metrics(scores)
    lengths = rollout.completion_lengths().float()
    return HeldOut(
        accuracy=metrics["accuracy"],
        reward=metrics["reward"],
        mean_length=float(lengths.mean()),
        nfe_per_token=float(rollout.nfe.float().sum() / lengths.sum().clamp(min=1)),
        n=len(examples),
        nfe_mean=float(rollout.nfe.float().mean()),
        texts=list(rollout.texts),
        scores=list(scores),
    )
