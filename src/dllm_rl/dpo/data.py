"""Preference pairs: rows with ``prompt`` / ``chosen`` / ``rejected`` -> two tokenized SFT examples per pair.

Rows come through the task data reader (:func:`dllm_rl.tasks.io.read_rows`: JSON lines, tables, ``hf:`` datasets,
naming the file and line of what it cannot read). Each response is tokenized as the SFT data's ``response`` is
(:func:`dllm_rl.sft.data.encode_row`: chat template, EOS), so a pair is exactly two SFT examples with one prompt.
A chosen / rejected value may be chat messages (UltraFeedback binarized's layout): its last message is the response.
Image pairs (LLaDA-V, MMaDA): the row's image column goes with the prompt of both responses, read as SFT reads it
(a path relative to the data file's folder, bytes, a data URI, ...).
Unusable rows are counted in a :class:`~dllm_rl.sft.data.DataReport` and skipped, or stop loading
(``on_bad_row: error``), as SFT's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllm_rl.dpo.config import PairDataConfig
from dllm_rl.errors import UserError
from dllm_rl.sft.data import BadRow, DataConfig, DataReport, SFTExample, _use_template, encode_row


@dataclass
class PairExample:
    """One pair: the chosen and the rejected response as SFT examples sharing one prompt."""

    chosen: SFTExample
    rejected: SFTExample
    where: str = ""

    @property
    def num_tokens(self) -> int:
        return max(self.chosen.num_tokens, self.rejected.num_tokens)


def _response(value: Any, name: str) -> str:
    """A response column's text: a string, or the last message's content of a chat-message list."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        value = value[-1].get("content")
    if value is None:
        raise BadRow("missing_field", f"missing field {name!r}")
    if not isinstance(value, str):
        raise BadRow("bad_field", f"field {name!r} must be a string or chat messages, got {type(value).__name__}")
    return value


def encode_pair(row: dict[str, Any], cfg: PairDataConfig, tokenizer: Any, eos_token_id: int, templated: bool,
                where: str, base_dir: Path | None = None) -> PairExample:
    """Tokenize one row's pair (its images read with relative paths from ``base_dir``); raises :class:`BadRow`
    when it cannot be used."""
    from dllm_rl.tasks.images import IMAGE_COLUMNS

    sft = DataConfig(prompt_field="prompt", response_field="response", chat_template=cfg.chat_template,
                     system_prompt=cfg.system_prompt, add_eos=cfg.add_eos, max_length=cfg.max_length,
                     pad_response_to=cfg.pad_response_to)
    if cfg.prompt_field not in row:
        raise BadRow("missing_field", f"missing field {cfg.prompt_field!r}; row has: {', '.join(sorted(row))}")
    prompt = row[cfg.prompt_field]
    chosen = _response(row.get(cfg.chosen_field), cfg.chosen_field)
    rejected = _response(row.get(cfg.rejected_field), cfg.rejected_field)
    if chosen == rejected:
        raise BadRow("same_responses", "chosen and rejected are the same text (no preference)")
    images = {c: row[c] for c in IMAGE_COLUMNS if row.get(c) is not None}
    pair = [encode_row({**images, "prompt": prompt, "response": text}, sft, tokenizer, eos_token_id, templated, where,
                       base_dir=base_dir) for text in (chosen, rejected)]
    return PairExample(pair[0], pair[1], where)


def load_pairs(cfg: PairDataConfig, tokenizer: Any, eos_token_id: int,
               verbose: bool = True) -> tuple[list[PairExample], DataReport]:
    """Read and tokenize the pairs of ``cfg.train_file`` (see the module docs); none usable is a UserError."""
    from dllm_rl.tasks.io import is_hf_name, read_rows

    if not cfg.train_file:
        raise UserError("no preference pairs: set data.train_file (a .jsonl / .parquet / .csv file or hf:org/name)")
    templated = _use_template(tokenizer, cfg.chat_template)
    base_dir = None if is_hf_name(cfg.train_file) else Path(cfg.train_file).expanduser().parent
    report = DataReport(source=cfg.train_file)
    pairs: list[PairExample] = []
    for where, row in read_rows(cfg.train_file):
        if cfg.limit is not None and len(pairs) >= cfg.limit:
            break
        report.read += 1
        try:
            pairs.append(encode_pair(row, cfg, tokenizer, eos_token_id, templated, where, base_dir))
        except BadRow as bad:
            report.drop(where, bad, cfg.on_bad_row)
    report.kept = len(pairs)
    if verbose:
        report.show()
    if not pairs:
        raise UserError(f"{cfg.train_file}: no usable pairs ({report.summary()}); fix the rows or the "
                        "data.*_field names")
    return pairs, report
