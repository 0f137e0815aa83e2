"""The ``judge:`` section of a reward (:class:`JudgeConfig`): which LLM judges, with what prompt, and how its
judgements become rewards. The judge itself is :mod:`dllm_rl.rewards.judge`, its generators
:mod:`dllm_rl.rewards.judge_backends`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from dllm_rl.config import Checked, field
from dllm_rl.config.vocabulary import device_field, dtype_field
from dllm_rl.errors import UserError
from dllm_rl.rewards.judge_text import DEFAULT_PATTERN


def _pattern_problem(value: str) -> str | None:
    try:
        groups = re.compile(value).groups
    except re.error as exc:
        return f"not a regular expression ({exc})"
    return None if groups == 1 else f"needs exactly one capture group (the score), has {groups}"


@dataclass
class JudgeConfig(Checked):
    """The ``judge:`` section: an LLM judge, its prompt template, and how its judgements become rewards."""

    model: str = field("", help="the judge: ORG/NAME or a local folder of a causal LM that transformers loads "
                                "(the seed recipe uses a long-CoT model such as Qwen3-8B)")
    backend: Literal["transformers", "vllm"] = field(
        "transformers", help="transformers, or vllm where it is installed (pip install vllm)")
    mode: Literal["outcome", "process"] = field(
        "outcome", help="outcome: one score per completion; process: one per chunk, placed on decoding steps")
    template: str | None = field(None, help="the judge prompt with {{prompt}} and {{completion}} (outcome) or "
                                            "{{prompt}} and {{chunk}} / {{prefix}} (process), and any data "
                                            "column as {{name}}; null: the built-in template of the mode")
    delimit: bool = field(True, help="paste each field (prompt, completion, chunk, prefix, data column) as a fenced "
                                     "block on its own lines whose fence is longer than any backtick run in the "
                                     "text, so the text cannot close it; false: paste raw (for a template that "
                                     "delimits by itself; otherwise a completion can forge the instruction and its "
                                     "verdict)")
    chunk_by: Literal["tokens", "steps"] = field(
        "tokens", help="process mode: cut the completion every chunk_length tokens, or every chunk_length decoding "
                       "steps of its rollout")
    chunk_length: int = field(200, ge=1, help="process mode: tokens (or decoding steps) per chunk (the seed's "
                                              "reward_chunk_length)")
    k_sample: int = field(1, ge=1, help="judgements per prompt or chunk (the seed's k_sample); with temperature 0 "
                                        "they are equal, so one generation serves them all")
    aggregate: Literal["mean", "consistency"] = field(
        "mean", help="how the k_sample judgements combine: their mean, or consistency (all equal: that value, "
                     "else `disagreement`)")
    disagreement: float = field(0.0, help="consistency: the score of a chunk whose judgements disagree")
    score_pattern: str = field(DEFAULT_PATTERN, check=_pattern_problem,
                               help="regular expression with one group reading the score (its last match)")
    score_min: float = field(-1.0, help="lowest valid score; a parsed score below it is a failure")
    score_max: float = field(1.0, help="highest valid score; a parsed score above it is a failure")
    fallback: float = field(0.0, help="the score of a judgement that does not parse (counted as judge_failures "
                                      "and logged)")
    max_new_tokens: int = field(256, ge=1, help="tokens the judge may write per judgement")
    temperature: float = field(0.0, ge=0, help="the judge's sampling temperature (0: greedy)")
    top_p: float = field(1.0, gt=0, le=1, help="nucleus sampling of the judge (with temperature > 0)")
    batch_size: int = field(16, ge=1, help="judge prompts per generate call")
    device: str = device_field(what="the judge (transformers backend)")
    dtype: str = dtype_field(what="the judge's weights")
    chat_template: bool = field(True, help="wrap the filled template as a user turn of the judge's chat template "
                                           "(when its tokenizer has one)")
    cache_size: int = field(100_000, ge=0, help="judge prompts whose judgements are kept (least recently used "
                                                "dropped first); 0: no cache")
    seed: int = field(0, help="seed of sampled judgements (temperature > 0)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_min > self.score_max:
            raise UserError(f"judge: score_min={self.score_min} is above score_max={self.score_max}")
