"""``chat``: general-task prompts as conversations, scored by a reward model, a judge or a function (no verifier).

A row gives its conversation in one of the layouts of the common open datasets:

* ``messages``: a list of ``{role, content}`` turns (UltraFeedback's ``messages``, TRL's conversational format);
* ``prompt``: a string (one user turn) or a list of turns (UltraFeedback binarized's ``prompt`` is a string);
* ``chosen`` (when neither is there): a conversation in the ``\\n\\nHuman: ... \\n\\nAssistant: ...`` text of
  Anthropic's HH-RLHF, or a list of turns (UltraFeedback binarized's ``chosen``).

The prompt is the conversation up to its last user turn (a trailing assistant turn, the dataset's answer, is
dropped). :meth:`ChatTask.build_prompt` applies the tokenizer's chat template to every turn with the generation
prompt; each example keeps the prompt's turns in its ``messages`` column, which a reward model reads as the
conversation before the completion (:mod:`dllm_rl.rewards.reward_model`). The HH text is parsed by hand: it is a plain
text convention, which no library reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from dllm_rl.tasks.base import DataError, Score, Task

_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")
_ROLES = {"Human": "user", "Assistant": "assistant"}


def hh_turns(text: str) -> list[dict[str, str]]:
    """The turns of an HH-RLHF conversation text (``"\\n\\nHuman: q\\n\\nAssistant: a"``), in order."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise ValueError("not an HH conversation: expected text starting with '\\n\\nHuman: '")
    return [{"role": _ROLES[role], "content": content} for role, content in zip(parts[1::2], parts[2::2])]


def as_turns(value: Any, where: str, column: str) -> list[dict[str, str]]:
    """``value`` (a list of turns, HH text or a plain string, which becomes one user turn) as a list of turns;
    DataError naming ``where`` and ``column`` when it is none of them."""
    if isinstance(value, str):
        return hh_turns(value) if value.startswith("\n\nHuman: ") else [{"role": "user", "content": value}]
    if isinstance(value, list | tuple) and value and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataError(f"{where}: column {column!r} must be a string or a non-empty list of {{role, content}} turns, "
                    f"got {type(value).__name__}")


def prompt_turns(row: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    """The conversation a row asks the model to continue: its turns up to the last user turn."""
    column = next(c for c in ("messages", "prompt", "chosen") if row.get(c) is not None)
    turns = as_turns(row[column], where, column)
    while turns and turns[-1]["role"] == "assistant":
        turns = turns[:-1]
    if not turns or turns[-1]["role"] != "user":
        raise DataError(f"{where}: column {column!r} has no user turn to answer")
    return turns


class ChatTask(Task):
    """Conversations to continue (see the module docstring); the reward is the run's reward model, judge or
    function: the task has no verifier of its own."""

    name: ClassVar[str] = "chat"
    has_verifier: ClassVar[bool] = False
    required_fields = (("messages", "prompt", "chosen"),)

    def normalize(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        row["messages"] = prompt_turns(row, where)
        return row

    def format_prompt(self, example: Mapping[str, Any]) -> str:
        """The last user turn (what ``plain`` style shows, and what a log line shows)."""
        return example["messages"][-1]["content"]

    def messages(self, example: Mapping[str, Any]) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        has_system = example["messages"][0]["role"] == "system"
        return (system if not has_system else []) + list(example["messages"])

    def _score(self, text: str, example: Mapping[str, Any]) -> Score:
        raise DataError("the chat task has no verifier: score it with reward.model, reward.judge.model, "
                        "reward.terms or reward.function")
