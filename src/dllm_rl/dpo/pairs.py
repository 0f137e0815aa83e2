"""Preference pairs from a model's own answers (``dllm-rl pairs``): sample ``k`` completions per task prompt,
score them with the task's reward, and pair a right answer (reward 1) with a wrong one of the same prompt.

The pairs are on-policy for the model that wrote them (the setting where DPO from a checkpoint helps most, e.g.
iterative / self-rewarding DPO): what the model already says when it is right, against what it says when it is
wrong. Completion ``j`` of prompt ``i`` is sampled with seed ``derive_seed(seed, i, j)``, so a file is
reproducible and does not depend on the batch size.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from dllm_rl.config import Checked, FieldError, field
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.sampling.config import DecodeConfig
from dllm_rl.seeding import derive_seed


@dataclass
class PairsConfig(Checked):
    """``dllm-rl pairs [CONFIG.yaml] [key=value ...] [--key value ...]``: the model that answers (``model:``), the
    task whose reward scores its answers, how many to sample (``decode:``: sample at ``temperature`` > 0) and where
    the pairs go."""

    #: flags of earlier releases -> their key now: --model, --device and the decoding flags (--temperature, --seed ...)
    RENAMED: ClassVar[dict[str, str]] = {"model": "model.path", "device": "model.device",
                                         **{f.name: f"decode.{f.name}" for f in dataclasses.fields(DecodeConfig)}}

    task: str = field(help="task name (countdown, gsm8k, ...) whose reward scores the answers, or a data file")
    out: str = field(help="output .jsonl file of prompt/chosen/rejected rows")
    model: ModelSection = field(default_factory=ModelSection, help="the model that writes the answers")
    data: str | None = field(None, help="the task's data file (default: its file in the shared data folder)")
    split: str = field("train", help="split of a named task")
    limit: int | None = field(None, ge=1, help="use only the first N prompts")
    prompt_style: str | None = field(None, choices=("chat", "plain", "compact"),
                                     help="the task's prompt style (default: the task's own)")
    k: int = field(8, ge=2, help="completions sampled per prompt (a pair needs 2)")
    pairs_per_prompt: int = field(1, ge=1, help="at most this many pairs per prompt")
    batch_size: int = field(64, ge=1, help="sequences decoded together (the pairs do not depend on it)")
    decode: DecodeConfig = field(
        default_factory=lambda: DecodeConfig(temperature=1.0), help="how the answers are sampled (temperature 1 "
        "unless given; it must be > 0): completion j of prompt i with seed derive_seed(decode.seed, i, j)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decode.temperature == 0:
            raise FieldError("decode.temperature", "0 decodes one answer per prompt; sample with a temperature > 0 "
                             "(e.g. decode.temperature=1)")


@dataclass
class PairStats:
    prompts: int = 0  # prompts sampled
    completions: int = 0
    correct: int = 0  # completions with reward 1
    pairs: int = 0
    no_pair: int = 0  # prompts with only right or only wrong answers

    def summary(self) -> str:
        rate = self.correct / max(self.completions, 1)
        return (f"{self.pairs} pairs from {self.prompts} prompts x {self.completions // max(self.prompts, 1)} "
                f"completions ({rate:.1%} right; {self.no_pair} prompts without both a right and a wrong answer)")


def pair_up(texts: Sequence[str], right: Sequence[bool], per_prompt: int) -> list[tuple[str, str]]:
    """Up to ``per_prompt`` (right, wrong) pairs of distinct texts, in sampling order: the i-th distinct right
    answer with the i-th distinct wrong one."""
    good = list(dict.fromkeys(t for t, ok in zip(texts, right) if ok))
    bad = list(dict.fromkeys(t for t, ok in zip(texts, right) if not ok and t not in good))
    return list(zip(good, bad))[:per_prompt]


@torch.no_grad()
def build_pairs(model: Any, tokenizer: Any, task: Any, decode: Any, *, k: int, seed: int = 0, per_prompt: int = 1,
                batch_size: int = 64) -> tuple[list[dict[str, str]], PairStats]:
    """``prompt`` / ``chosen`` / ``rejected`` rows (the prompt as the model reads it, the completions' texts) from
    ``k`` sampled completions of each of ``task``'s prompts, decoded with ``decode`` (a
    :class:`~dllm_rl.sampling.DecodeConfig`; sample with a temperature > 0: greedy decoding repeats one answer)."""
    from dllm_rl.models.image_inputs import PromptEncoder, repeat_rows
    from dllm_rl.sampling import generate_batched

    model.eval()
    examples = list(task)
    texts, ids, images = PromptEncoder(tokenizer).task_prompts(model, task, examples)
    ids, images = repeat_rows(ids, images, k)
    seeds = [derive_seed(seed, i, j) for i in range(len(examples)) for j in range(k)]
    rollout = generate_batched(model, ids, decode, seeds=seeds, tokenizer=tokenizer, batch_size=batch_size,
                               images=images)
    scores = task.score_examples(rollout.texts, [ex for ex in examples for _ in range(k)])
    stats = PairStats(prompts=len(examples), completions=len(scores))
    rows = []
    for i, prompt in enumerate(texts):
        done = rollout.texts[i * k:(i + 1) * k]
        right = [float(s) >= 1.0 for s in scores[i * k:(i + 1) * k]]
        stats.correct += sum(right)
        pairs = pair_up(done, right, per_prompt)
        stats.no_pair += not pairs
        rows += [{"prompt": prompt, "chosen": good, "rejected": bad} for good, bad in pairs]
    stats.pairs = len(rows)
    return rows, stats


def write_pairs(rows: list[dict[str, str]], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out
