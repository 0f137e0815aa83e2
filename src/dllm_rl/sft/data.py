"""SFT data: rows with ``prompt`` / ``response`` (or chat ``messages``) -> token ids -> ScoringBatch.

Rows come from JSON lines, or from a ``.csv`` / ``.tsv`` / ``.parquet`` file through the task data reader
(:func:`dllm_rl.tasks.io.read_rows`, which names the file and line of a file it cannot read).

Rows are never truncated. A row that cannot be used (not UTF-8, invalid JSON, missing field, empty response,
longer than ``max_length``, a step map of the wrong length) is counted under its reason and skipped
(``on_bad_row: skip``, the default, printing the first few with file and line) or stops loading with
that message (``on_bad_row: error``). :class:`DataReport` keeps the counts.

Image-text pairs (LLaDA-V, MMaDA): a row may carry its image(s) where the task data reader looks for them, in an
``image`` (else ``images``) column: a path relative to the data file's folder, bytes, a PIL image or a
``datasets`` Image value (:func:`dllm_rl.tasks.images.load_image`). The prompt gets one ``<image>`` line per
image unless it places its own, and the count must match. The example keeps its prompt text and images: what
the images become (spliced features, or VQ codes) depends on the model, so the trainer encodes them per
micro-batch (:func:`encode_images`). An unreadable image drops the row as ``bad_image``, naming it. Image
positions are prompt context: never masked, never scored.

One file on purpose (about 400 lines): it is one pipeline, row -> texts -> ids -> batch, and the row's place (file
and line) and its reason for being dropped travel through every stage into one :class:`DataReport`; split by
stage, each module would pass the same row context back and forth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from dllm_rl.config import Checked, ConfigError
from dllm_rl.config import field as cfg_field
from dllm_rl.errors import UserError
from dllm_rl.estimators.batch import ScoringBatch
from dllm_rl.jsonl import JSONLError, iter_jsonl
from dllm_rl.models.prompt_images import PromptImages

#: file names read as tables (every other file is JSON lines)
TABLE_SUFFIXES = (".csv", ".csv.gz", ".tsv", ".parquet")


@dataclass
class ResponseFormat(Checked):
    """How a row's prompt and response(s) become tokens, and which rows are used: shared by SFT's examples and DPO's
    pairs (:mod:`dllm_rl.dpo.data`)."""

    chat_template: Literal["auto", "always", "never"] = cfg_field(
        "auto", help="wrap prompts in the tokenizer's chat template: auto = when the tokenizer has one")
    system_prompt: str | None = cfg_field(None, help="system message for the chat template")
    add_eos: bool = cfg_field(True, help="end every response with the EOS token (the model learns to stop)")
    pad_response_to: int | None = cfg_field(
        None, ge=1, help="pad each response with EOS tokens to this many tokens, all in the loss (LLaDA SFT, Nie et "
        "al. 2025 sec. 2.3/app. B: the model learns to fill a fixed gen_length with EOS after the answer); "
        "longer responses are dropped, never cut")
    max_length: int = cfg_field(
        1024, ge=1, help="drop (never truncate) rows whose prompt + response (a pair's longer response) exceed this "
        "many tokens")
    on_bad_row: Literal["skip", "error"] = cfg_field(
        "skip", help="skip (and count) unusable rows, or stop with an error naming the file and line")
    limit: int | None = cfg_field(None, ge=0, help="use only the first N usable rows")


@dataclass
class DataConfig(ResponseFormat):
    """Where the SFT examples come from and how they become tokens."""

    train_file: str = cfg_field("", help="training file with prompt/response (or messages) rows: JSON lines, or "
                                "a .csv / .tsv / .parquet table")
    prompt_field: str = cfg_field("prompt", help="column holding the prompt text")
    response_field: str = cfg_field("response", help="column holding the target response text")
    messages_field: str = cfg_field(
        "messages", help="column holding chat messages [{role, content}, ...]; the last (assistant) one is the "
        "response; used when a row has no prompt/response columns")
    step_map_field: str = cfg_field(
        "steps", help="column with the decoding step of every response token (trace objective); `dllm-rl generate "
        "--trace` writes it as 'steps' next to the generated 'token_ids'")
    response_ids_field: str = cfg_field(
        "token_ids", help="column with the response as token ids, used verbatim instead of tokenizing the response "
        "text (trace files from `dllm-rl generate --trace`); no EOS is appended to them")
    task: str | None = cfg_field(
        None, help="build prompt and response from a task's rows (e.g. countdown from `dllm-rl data make`): "
        "prompt = the task's prompt in `prompt_style`, response = the task's reference completion")
    prompt_style: Literal["chat", "plain", "compact"] = cfg_field(
        "chat", help="prompt style of `task` (compact = terse one-line prompts for character-level models)")
    keep_if: str | None = cfg_field(
        None, help="use only the rows whose column of this name is true, counting the others as dropped "
        "(not_kept), never an error: e.g. `correct`, which `dllm-rl eval`'s items/<setting>.jsonl sets on the "
        "answers the task's reward calls right (a model's own right answers: certainty_forcing, docs/methods.md)")


@dataclass
class SFTExample:
    """One tokenized row; an image row also keeps its prompt text (with its ``<image>`` placeholders) and images,
    its ``prompt_ids`` being the text's tokens until :func:`encode_images` puts the images in."""

    prompt_ids: list[int]
    response_ids: list[int]
    step_map: list[int] | None = None
    where: str = ""
    prompt_text: str | None = None
    images: list[Any] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class DataReport:
    """How many rows were read, kept and dropped (by reason), with the first few messages."""

    source: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)

    def summary(self) -> str:
        drops = ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items())) or "none"
        return f"{self.source}: read {self.read} rows, kept {self.kept}, dropped {sum(self.dropped.values())} ({drops})"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "read": self.read, "kept": self.kept, "dropped": dict(self.dropped),
                "first_messages": self.messages}

    def drop(self, where: str, bad: BadRow, on_bad_row: str) -> None:
        """Count row ``where`` dropped for ``bad`` (keeping the first messages), or, with ``on_bad_row=error``,
        stop with one line naming it."""
        if on_bad_row == "error":
            raise UserError(f"{where}: {bad} (set data.on_bad_row=skip to skip such rows)") from None
        self.dropped[bad.reason] += 1
        if len(self.messages) < 5:
            self.messages.append(f"{where}: {bad}")

    def show(self) -> None:
        """Print the summary and the first skipped rows."""
        print(f"data: {self.summary()}")
        for m in self.messages:
            print(f"data: skipped {m}")


class BadRow(ValueError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _use_template(tokenizer: Any, mode: str) -> bool:
    has = bool(getattr(tokenizer, "chat_template", None))
    if mode == "always" and not has:
        raise ConfigError("data.chat_template=always but the tokenizer has no chat template; set "
                          "data.chat_template=auto or never")
    return has and mode != "never"


def _row_images(row: dict[str, Any], where: str, base_dir: Path | None) -> list[Any] | None:
    """The row's images (RGB PIL images) from its image column, or None when it has none."""
    from dllm_rl.tasks import DataError
    from dllm_rl.tasks.images import IMAGE_COLUMNS, row_images

    column = next((c for c in IMAGE_COLUMNS if row.get(c) is not None), None)
    if column is None:
        return None
    try:
        return row_images(row, column, base_dir, where)
    except DataError as exc:
        raise BadRow("bad_image", str(exc).removeprefix(f"{where}: ")) from None


def _with_images(prompt: str, images: list[Any] | None) -> str:
    """The user prompt with its ``<image>`` placeholders (one per image), checked against the image count."""
    from dllm_rl.tasks.images import IMAGE_PLACEHOLDER, placeholder_count, with_placeholders

    n = len(images or [])
    prompt = with_placeholders(prompt, n)
    if placeholder_count(prompt) != n:
        raise BadRow("bad_image", f"the prompt has {placeholder_count(prompt)} {IMAGE_PLACEHOLDER!r} "
                                  f"placeholder(s) for {n} image(s); give one image per placeholder")
    return prompt


def _texts(row: dict[str, Any], cfg: DataConfig, tokenizer: Any, templated: bool, task: Any = None,
           where: str = "", images: list[Any] | None = None) -> tuple[str, str]:
    """(prompt text, response text) of one row, rendered with the chat template when ``templated``; ``images``:
    the row's, whose placeholders the user prompt gets."""
    if task is not None:
        return _task_texts(row, cfg, tokenizer, templated, task, where)
    if cfg.prompt_field in row or cfg.response_field in row:
        prompt, response = _pair(row, cfg)
        prompt = _with_images(prompt, images) if images else prompt
        if not templated:
            return prompt, response
        msgs = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        msgs.append({"role": "user", "content": prompt})
        messages = msgs + [{"role": "assistant", "content": response}]
    elif cfg.messages_field in row:
        messages = _messages(row, cfg, templated)
        if images:
            user = next(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[user] = {**messages[user], "content": _with_images(messages[user]["content"], images)}
    else:
        raise BadRow("missing_field", f"missing fields {cfg.prompt_field!r}/{cfg.response_field!r} "
                                      f"(or {cfg.messages_field!r}); row has: {', '.join(sorted(row)) or 'none'}")
    return _render(messages, tokenizer)


def _task_texts(row: dict[str, Any], cfg: DataConfig, tokenizer: Any, templated: bool, task: Any,
                where: str) -> tuple[str, str]:
    """A task's row: its prompt and its reference completion."""
    from dllm_rl.tasks import DataError

    try:
        ex = task.prepare(dict(row), where)
    except DataError as exc:
        raise BadRow("bad_field", str(exc).removeprefix(f"{where}: ")) from None
    if ex is None:
        raise BadRow("filtered", f"the {task.name} task skips this row")
    response = task.reference_completion(ex)
    if not response:
        raise BadRow("empty_response", f"the {task.name} task has no reference completion for this row")
    if not (templated and cfg.prompt_style == "chat"):
        return task.build_prompt(ex, None), response
    messages = task.messages(ex) + [{"role": "assistant", "content": response}]
    return _render(messages, tokenizer)


def _pair(row: dict[str, Any], cfg: DataConfig) -> tuple[str, str]:
    """The prompt and response columns of a row, checked."""
    for name in (cfg.prompt_field, cfg.response_field):
        if row.get(name) is None:
            raise BadRow("missing_field", f"missing field {name!r}")
        if not isinstance(row[name], str):
            raise BadRow("bad_field", f"field {name!r} must be a string, got {type(row[name]).__name__}")
    prompt, response = row[cfg.prompt_field], row[cfg.response_field]
    if not response.strip():
        raise BadRow("empty_response", "empty response")
    return prompt, response


def _messages(row: dict[str, Any], cfg: DataConfig, templated: bool) -> list[dict[str, str]]:
    """The chat messages column of a row, checked (the system prompt put first where it has none)."""
    messages = row[cfg.messages_field]
    ok = isinstance(messages, list) and len(messages) >= 2 and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages)
    if not ok:
        raise BadRow("bad_messages", f"{cfg.messages_field!r} must be a list of >= 2 {{role, content}} dicts")
    if messages[-1]["role"] != "assistant":
        raise BadRow("bad_messages", f"the last message must be the assistant's, got {messages[-1]['role']!r}")
    if not messages[-1]["content"].strip():
        raise BadRow("empty_response", "empty response (last assistant message)")
    if not templated:
        raise BadRow("bad_messages", "chat messages need a tokenizer with a chat template "
                                     "(or use prompt/response columns)")
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": cfg.system_prompt}] + list(messages)
    return messages


def _render(messages: list[dict[str, str]], tokenizer: Any) -> tuple[str, str]:
    """Chat-template a conversation; the response text is everything after the generation prompt
    (so it carries the template's end-of-turn marker)."""
    prompt_text = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(messages, tokenize=False)
    if not full_text.startswith(prompt_text):
        raise BadRow("bad_messages", "the chat template does not render the prompt as a prefix of the conversation")
    return prompt_text, full_text[len(prompt_text):]


def encode_row(row: dict[str, Any], cfg: DataConfig, tokenizer: Any, eos_token_id: int,
               templated: bool | None = None, where: str = "", task: Any = None,
               base_dir: str | Path | None = None) -> SFTExample:
    """Tokenize one row (its images, if any, read with relative paths from ``base_dir``); raises
    :class:`BadRow` (with a reason) when it cannot be used as is."""
    if templated is None:
        templated = _use_template(tokenizer, cfg.chat_template)
    reads_images = task is None or hasattr(task, "images")  # a text task's rows are text whatever columns they have
    images = _row_images(row, where, Path(base_dir) if base_dir is not None else None) if reads_images else None
    verbatim = row.get(cfg.response_ids_field) if task is None else None
    if verbatim is not None:
        if not isinstance(verbatim, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in verbatim):
            raise BadRow("bad_field", f"{cfg.response_ids_field!r} must be a list of token ids")
        if not verbatim:
            raise BadRow("empty_response", f"empty {cfg.response_ids_field!r}")
        if max(verbatim) >= len(tokenizer) or min(verbatim) < 0:
            raise BadRow("bad_field", f"{cfg.response_ids_field!r} has ids outside the tokenizer's vocabulary")
        text_row = {k: v for k, v in row.items() if k != cfg.response_ids_field}
        text_row.setdefault(cfg.response_field, "<ids>")
        prompt, _ = _texts(text_row, cfg, tokenizer, templated, None, where, images)
        p_ids, r_ids = _prompt_tokens(tokenizer, prompt, images), list(verbatim)
    else:
        prompt, response = _texts(row, cfg, tokenizer, templated, task, where, images)
        p_ids = _prompt_tokens(tokenizer, prompt, images)
        r_ids = list(tokenizer.encode(response, add_special_tokens=False))
        if cfg.add_eos:
            r_ids.append(eos_token_id)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in p_ids + r_ids:
        raise BadRow("unknown_token", "text has characters the tokenizer maps to its unknown token")
    if cfg.pad_response_to is not None and verbatim is None:
        if len(r_ids) > cfg.pad_response_to:
            raise BadRow("too_long", f"response has {len(r_ids)} tokens > data.pad_response_to={cfg.pad_response_to}")
        r_ids = r_ids + [eos_token_id] * (cfg.pad_response_to - len(r_ids))
    if len(p_ids) + len(r_ids) > cfg.max_length:
        raise BadRow("too_long", f"prompt + response = {len(p_ids) + len(r_ids)} tokens > data.max_length="
                                 f"{cfg.max_length} (rows are never truncated)")
    step_map = None
    if cfg.step_map_field in row and row[cfg.step_map_field] is not None:
        sm = row[cfg.step_map_field]
        if not isinstance(sm, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in sm):
            raise BadRow("bad_step_map", f"{cfg.step_map_field!r} must be a list of integers")
        if len(sm) != len(r_ids):
            raise BadRow("bad_step_map", f"{cfg.step_map_field!r} has {len(sm)} entries for {len(r_ids)} response "
                                         "tokens (set data.add_eos / pad_response_to as at generation time)")
        step_map = list(sm)
    return SFTExample(p_ids, r_ids, step_map, where, prompt if images else None, images)


def _prompt_tokens(tokenizer: Any, prompt: str, images: list[Any] | None) -> list[int]:
    """The prompt's token ids; with images, of its text only (what an image becomes is the model's, at
    :func:`encode_images`)."""
    from dllm_rl.tasks.images import IMAGE_PLACEHOLDER

    text = prompt.replace(IMAGE_PLACEHOLDER, "") if images else prompt
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_images(examples: list[SFTExample], prompts: Any, model: Any
                  ) -> tuple[list[SFTExample], PromptImages | None]:
    """The examples with the images of image rows put in for ``model`` (a
    :class:`~dllm_rl.models.image_inputs.PromptEncoder`: LLaDA-V's placeholders widened to their features'
    positions, MMaDA's images as VQ codes in the prompt ids) and, for LLaDA-V, the batch's
    :class:`PromptImages` (each distinct image encoded once; with gradient into the parts ``prompts.train_vision``
    names, none by default)."""
    todo = [i for i, e in enumerate(examples) if e.images]
    if not todo:
        return examples, None
    ids, pim = prompts.encode(model, [examples[i].prompt_text for i in todo], [examples[i].images for i in todo])
    out = list(examples)
    rows: list[tuple] = [() for _ in examples]
    for k, i in enumerate(todo):
        out[i] = replace(examples[i], prompt_ids=ids[k])
        if pim is not None:
            rows[i] = pim.rows[k]
    return out, PromptImages(pim.features, rows) if pim is not None else None


def load_sft_data(cfg: DataConfig, tokenizer: Any, eos_token_id: int, path: str | Path | None = None,
                  verbose: bool = True) -> tuple[list[SFTExample], DataReport]:
    """Read and tokenize an SFT file (JSON lines or a table, see the module docs), counting and skipping (or
    refusing) unusable rows; a file with no usable row is a :class:`~dllm_rl.errors.UserError`."""
    path = Path(path or cfg.train_file)
    if not str(path) or not path.is_file():
        raise FileNotFoundError(f"{path}: SFT data file not found (set data.train_file)")
    templated = _use_template(tokenizer, cfg.chat_template)
    task = None
    if cfg.task is not None:
        from dllm_rl.tasks import get_task

        # the file as the task's data (never read through the task): an image task reads relative image paths from
        # its folder
        task = get_task(cfg.task, data=str(path), prompt_style=cfg.prompt_style, system_prompt=cfg.system_prompt)
    report = DataReport(source=str(path))
    examples: list[SFTExample] = []

    def full() -> bool:
        return cfg.limit is not None and len(examples) >= cfg.limit

    def drop(where: str, bad: BadRow) -> None:
        report.drop(where, bad, cfg.on_bad_row)

    def bad_line(err: JSONLError) -> None:  # not UTF-8, not JSON, not an object
        if not full():  # a line past the limit is never read
            report.read += 1
            drop(f"{path}:{err.line}", BadRow("not_utf8" if err.reason == "not_utf8" else "invalid_json", err.detail))

    for where, row in _rows(path, bad_line):
        if full():
            break
        report.read += 1
        if cfg.keep_if is not None and row.get(cfg.keep_if) is not True:  # filtered, not bad: on_bad_row stays out
            report.dropped["not_kept"] += 1
            continue
        try:
            examples.append(encode_row(row, cfg, tokenizer, eos_token_id, templated, where, task, path.parent))
        except BadRow as bad:
            drop(where, bad)
    report.kept = len(examples)
    if verbose:
        report.show()
    if not examples:
        raise UserError(f"{path}: no usable rows ({report.summary()}); fix the rows or the data.*_field names")
    return examples, report


def _rows(path: Path, bad_line) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of every row: JSON lines through :func:`iter_jsonl` (a bad line goes to ``bad_line``),
    tables through the task data reader."""
    if path.name.lower().endswith(TABLE_SUFFIXES):
        from dllm_rl.tasks.io import read_rows

        yield from read_rows(path)
        return
    for n, row in iter_jsonl(path, torn_last_line="error", on_error=bad_line):
        yield f"{path}:{n}", row


def collate(examples: list[SFTExample], pad_token_id: int, images: PromptImages | None = None) -> ScoringBatch:
    """Left-pad prompts, right-pad responses: a :class:`ScoringBatch` whose ``completion_mask`` marks every
    response token (EOS included) and ``completion_valid`` hides the right padding; ``images``: the examples'
    (:func:`encode_images`)."""
    if not examples:
        raise ValueError("collate: empty batch")
    b = len(examples)
    p = max(len(e.prompt_ids) for e in examples)
    g = max(len(e.response_ids) for e in examples)
    prompt = torch.full((b, p), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p), dtype=torch.bool)
    comp = torch.full((b, g), pad_token_id, dtype=torch.long)
    comp_mask = torch.zeros((b, g), dtype=torch.bool)
    has_map = all(e.step_map is not None for e in examples)
    step_map = torch.full((b, g), -1, dtype=torch.long) if has_map else None
    for i, e in enumerate(examples):
        lp, lr = len(e.prompt_ids), len(e.response_ids)
        if lp:
            prompt[i, p - lp:] = torch.tensor(e.prompt_ids)
            prompt_mask[i, p - lp:] = True
        comp[i, :lr] = torch.tensor(e.response_ids)
        comp_mask[i, :lr] = True
        if step_map is not None:
            step_map[i, :lr] = torch.tensor(e.step_map)
    return ScoringBatch(prompt, prompt_mask, comp, comp_mask, step_map=step_map, completion_valid=comp_mask.clone(),
                        images=images)
