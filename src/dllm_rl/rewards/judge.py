"""An autoregressive LLM judge as a reward: outcome scores, or process scores per chunk mapped onto decoding steps.

The judge is any causal LM that transformers loads (vLLM is an optional backend where it is installed). It reads a
prompt built from a **template** whose ``{{name}}`` placeholders are filled in one pass (everything else, LaTeX
braces included, is kept verbatim): ``{{prompt}}`` (the policy's prompt), ``{{completion}}`` (outcome mode),
``{{chunk}}`` and ``{{prefix}}`` (process mode: the chunk judged, and the completion from its start to the chunk's
end), and any data column by its name (e.g. ``{{answer}}``). Each field is pasted as a fenced block that its text
cannot close (``delimit``), and the judge answers with a score that ``score_pattern`` reads in its own words (its
last match outside echoed blocks; by default the last ``\\boxed{...}``): :mod:`dllm_rl.rewards.judge_text`.

- **Outcome mode**: one score per completion.
- **Process mode** (the seed recipe's ``process_reward_model`` with ``reward_chunk_length`` and ``k_sample``):
  the completion is cut into chunks of ``chunk_length`` tokens (``chunk_by: tokens``) or of ``chunk_length``
  decoding steps (``chunk_by: steps``); each chunk is judged ``k_sample`` times and the judgements are
  aggregated by their mean, or by consistency (all equal: that value; else ``disagreement``. The seed recipe
  gives a disagreeing chunk the outcome's sign and then z-scores each chunk over the group; here group
  advantages do the normalising). A chunk's score lands on the latest decoding step among its own tokens (the
  seed recipe's placement; where a chunk has no counted token, the latest step before it); chunks landing on
  one step add up (the seed recipe lets the later one win). The result is one score per decoding step, the format of
  :mod:`dllm_rl.rewards.safe`. Process mode reads the rollout's ``step_map`` column (per completion, the step of
  each completion token; -1 for tokens that do not count) and, where given, ``completion_ids`` (else the
  completion text is encoded with the policy's tokenizer).

Parsing is strict: a judgement without a match, or whose score lies outside ``[score_min, score_max]``, is a
failure, counted in :attr:`Judge.stats` (``judge_failures``) and logged, and scores ``fallback``. Judge prompts of a
whole rollout batch are generated together, ``batch_size`` at a time, and cached by their text (so by prompt and
chunk): a chunk judged once is never judged again while it stays in the cache.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dllm_rl.errors import UserError
from dllm_rl.rewards.judge_backends import HFGenerator, VLLMGenerator
from dllm_rl.rewards.judge_config import JudgeConfig
from dllm_rl.rewards.judge_text import DEFAULT_TEMPLATES, check_template, parse_score, render
from dllm_rl.tasks.base import completion_text

logger = logging.getLogger(__name__)


def aggregate(scores: Sequence[float], how: str, disagreement: float) -> float:
    """One score from ``k_sample`` judgements: their mean, or (``consistency``) their common value when all agree
    and ``disagreement`` otherwise."""
    if how == "mean":
        return math.fsum(scores) / len(scores)
    return scores[0] if all(s == scores[0] for s in scores) else disagreement


def chunk_positions(n_tokens: int, step_map: Sequence[int], chunk_by: str, length: int) -> list[list[int]]:
    """The token positions of each chunk: runs of ``length`` positions (``tokens``), or the counted positions
    committed in each run of ``length`` decoding steps (``steps``: the distinct counted values of ``step_map`` in
    increasing order)."""
    if chunk_by == "tokens":
        return [list(range(s, min(s + length, n_tokens))) for s in range(0, n_tokens, length)]
    steps = sorted({s for s in step_map[:n_tokens] if s >= 0})
    groups = [set(steps[i:i + length]) for i in range(0, len(steps), length)]
    return [[p for p in range(n_tokens) if step_map[p] in g] for g in groups]


def place_on_steps(chunk_scores: Sequence[float], chunks: Sequence[Sequence[int]],
                   step_map: Sequence[int]) -> list[float]:
    """Per-decoding-step scores (one per distinct counted step, in decoding order): each chunk's score on the
    latest counted step among its own positions (none counted: the latest counted step before the chunk, else the
    first step); scores landing on one step add up."""
    steps = sorted({s for s in step_map if s >= 0})
    rank = {s: k for k, s in enumerate(steps)}
    out = [0.0] * len(steps)
    for score, chunk in zip(chunk_scores, chunks):
        if not steps:
            break
        own = [step_map[p] for p in chunk if step_map[p] >= 0]
        before = [s for s in step_map[:min(chunk, default=0)] if s >= 0]
        out[rank[max(own or before)] if own or before else 0] += score
    return out


# ------------------------------------------------------------------------------------------------ the judge
@dataclass
class Request:
    """One judge prompt of a completion: its text and, in process mode, the chunk's token positions."""

    text: str
    positions: list[int] | None = None
    pasted: tuple[str, ...] = ()  # the fields pasted into it: a judgement repeating one is not read as a verdict


class Judge:
    """An LLM judge as a TRL-signature reward: a float per completion (outcome mode) or a list of per-step
    scores (process mode). ``stats`` counts the prompts generated (``judge_prompts``), the prompts answered without
    generating (``judge_cache_hits``: found in the cache, or repeating another prompt of the same call; the two add
    up to the prompts asked) and the judgements that did not parse."""

    def __init__(self, cfg: JudgeConfig, key: str = "judge", policy_tokenizer: Any = None,
                 generator: Callable[[list[str], int, int], list[list[str]]] | None = None,
                 model_key: str | None = None):
        """``key`` names the judge's section in messages, ``model_key`` the key that named its model (default
        ``key.model``); ``generator`` replaces the backend (texts, n, seed -> n outputs per text)."""
        self.cfg, self.key = cfg, key
        model_key = model_key or f"{key}.model"
        self.template = cfg.template if cfg.template is not None else DEFAULT_TEMPLATES[cfg.mode]
        check_template(self.template, cfg.mode, f"{key}.template")
        if not cfg.model and generator is None:
            raise UserError(f"{model_key}: not set; give ORG/NAME or a folder of a causal LM")
        if generator is None:
            generator = (HFGenerator if cfg.backend == "transformers" else VLLMGenerator)(cfg, model_key)
        self.generate = generator
        self.policy_tokenizer = policy_tokenizer
        self.cache: OrderedDict[str, list[float | None]] = OrderedDict()
        self.stats = {"judge_prompts": 0, "judge_cache_hits": 0, "judge_failures": 0}
        self.__name__ = "judge"

    # ---------------------------------------------------------------- prompts
    def requests(self, prompts: Sequence[Any], completions: Sequence[Any],
                 columns: dict[str, list[Any]]) -> list[list[Request]]:
        """The judge prompts of each completion: one (outcome) or one per chunk (process)."""
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            values = {k: v[i] for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == len(prompts)}
            values["prompt"] = p
            if self.cfg.mode == "outcome":
                out.append([self._request({**values, "completion": c})])
            else:
                out.append(self._chunk_requests(c, values, self._ids(c, values), values.get("step_map")))
        return out

    def _ids(self, completion: Any, values: dict[str, Any]) -> list[int]:
        if values.get("completion_ids") is not None:
            return list(values["completion_ids"])
        if self.policy_tokenizer is None:
            raise UserError(f"{self.key}: mode=process needs the rollout's completion_ids column or the policy's "
                            "tokenizer to cut completions into tokens")
        return self.policy_tokenizer(completion_text(completion), add_special_tokens=False)["input_ids"]

    def _chunk_requests(self, completion: Any, values: dict[str, Any], ids: list[int],
                        step_map: Sequence[int] | None) -> list[Request]:
        if step_map is None:
            raise UserError(f"{self.key}: mode=process needs the rollout's step_map column (the decoding step of "
                            "each completion token) to place chunk scores on decoding steps")
        step_map = list(step_map)
        decode = self._decoder()
        reqs = []
        counted = [p for p in range(min(len(ids), len(step_map))) if step_map[p] >= 0]
        n = counted[-1] + 1 if counted else 0  # the EOS filling after the last counted token is not judged
        for pos in chunk_positions(n, step_map, self.cfg.chunk_by, self.cfg.chunk_length):
            chunk = decode([ids[p] for p in pos])
            prefix = decode(ids[:max(pos) + 1])
            reqs.append(self._request({**values, "completion": completion, "chunk": chunk, "prefix": prefix}, pos))
        return reqs

    def _request(self, values: dict[str, Any], positions: list[int] | None = None) -> Request:
        text, pasted = render(self.template, values, f"{self.key}.template", self.cfg.delimit)
        return Request(text, positions, pasted)

    def _decoder(self) -> Callable[[list[int]], str]:
        tok = self.policy_tokenizer
        if tok is None:
            raise UserError(f"{self.key}: mode=process needs the policy's tokenizer to turn chunks into text")
        return lambda ids: tok.decode(ids, skip_special_tokens=True)

    # ---------------------------------------------------------------- judgements
    def judgements(self, texts: list[str],
                   pasted: dict[str, tuple[str, ...]] | None = None) -> dict[str, list[float | None]]:
        """``k_sample`` parsed scores (None: unparsable) of each distinct text, from the cache or generated in
        batches (one generation per text with temperature 0); ``pasted`` gives a text's fields, whose copies in a
        judgement are not its verdict."""
        cfg = self.cfg
        distinct = list(dict.fromkeys(texts))
        found = {t: self.cache[t] for t in distinct if t in self.cache}
        todo = [t for t in distinct if t not in found]
        self.stats["judge_cache_hits"] += len(texts) - len(todo)  # every prompt answered without generating it
        for t in found:
            self.cache.move_to_end(t)
        if todo:
            n = cfg.k_sample if cfg.temperature > 0 else 1
            outputs = self.generate(todo, n, cfg.seed + self.stats["judge_prompts"])
            self.stats["judge_prompts"] += len(todo)
            bad: list[str] = []
            for text, outs in zip(todo, outputs):
                echo = (pasted or {}).get(text, ())
                scores = [parse_score(o, cfg.score_pattern, cfg.score_min, cfg.score_max, echo) for o in outs]
                bad += [o for o, v in zip(outs, scores) if v is None]
                found[text] = (scores * cfg.k_sample)[:cfg.k_sample] if n == 1 else scores
                if cfg.cache_size:
                    self.cache[text] = found[text]
            while len(self.cache) > cfg.cache_size:
                self.cache.popitem(last=False)
            self._log_failures(bad, sum(map(len, outputs)))
        return found

    def _log_failures(self, bad: list[str], generated: int) -> None:
        """Count the judgements that did not parse and say so once per batch, with the end of one of them."""
        if bad:
            self.stats["judge_failures"] += len(bad)
            cfg = self.cfg
            logger.warning("%s: %d of %d judgement(s) without a score matching score_pattern within [%g, %g] score "
                           "the fallback %g; e.g. ...%r", self.key, len(bad), generated, cfg.score_min, cfg.score_max,
                           cfg.fallback, bad[0][-120:])

    def score(self, scores: list[float | None]) -> float:
        """One score from a prompt's judgements (a failure counts as ``fallback``)."""
        cfg = self.cfg
        return aggregate([cfg.fallback if s is None else s for s in scores], cfg.aggregate, cfg.disagreement)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counters, which also seed the next sampled judgements (the cache is not
        kept: at temperature 0 a judgement regenerated after a resume equals the cached one)."""
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.update({k: int(v) for k, v in state["stats"].items()})

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[Any]:
        reqs = self.requests(prompts, completions, columns)
        found = self.judgements([r.text for rs in reqs for r in rs], {r.text: r.pasted for rs in reqs for r in rs})
        if self.cfg.mode == "outcome":
            return [self.score(found[rs[0].text]) for rs in reqs]
        return [place_on_steps([self.score(found[r.text]) for r in rs], [r.positions for r in rs],
                               list(columns["step_map"][i])) for i, rs in enumerate(reqs)]
