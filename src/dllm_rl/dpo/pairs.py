"""Preference pairs from a model's own answers (``dllm-rl pairs``): sample ``k`` completions per task prompt,
score them with the task's reward, and pair a right answer (reward 1) with a wrong one of the same prompt.

The pairs are on-policy for the model that wrote them (the setting where DPO from a checkpoint helps most, e.g.
iterative / self-rewarding DPO): what the model already says when it is right, against what it says when it is
wrong. Completion ``j`` of prompt ``i`` is sampled with seed ``derive_seed(seed, i, j)``, so a file is
reproducible and does not depend on the batch size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm_rl.seeding import derive_seed


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
