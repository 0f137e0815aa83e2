"""The decoding trace viewer: one self-contained HTML file that replays a diffusion decode step by step.

A trace record says, for every generated position, which token ended there and at which global step it
was committed (the ``step_map`` of a :class:`~dllm_rl.sampling.Rollout`, ``-1`` = never committed), and
optionally the confidence it had when committed. The page embeds the records as JSON and draws them with
a few lines of inline JavaScript: no network resources, no external scripts, fonts or images. A prompt's
images (LLaDA-V, MMaDA) are drawn where they stand in the prompt, from PNG ``data:`` URIs embedded in the
records (scaled to at most :data:`THUMBNAIL` px a side), in place of the hundreds of positions they fill.

A uniform-state rollout (DiffusionGemma) commits nothing for good: its record carries ``uniform_steps``, per counted
step the canvas it worked on, the ids drawn there and the positions accepted
(:func:`~dllm_rl.sampling.uniform_rollout.uniform_steps`), and the page
shows each step's draws in that canvas, the accepted ones highlighted and the re-noised ones struck through, the
earlier canvases as kept, and after the last step the kept canvases.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError
from dllm_rl.jsonl import iter_jsonl, json_safe

THUMBNAIL = 256  # px, the longer side of an image drawn in the page

__all__ = ["TraceRecord", "image_data_uri", "load_trace_jsonl", "normalize_trace", "records_from_rollout",
           "render_html", "uniform_steps", "write_html"]


@dataclass
class TraceRecord:
    """What the viewer draws for one sequence (tokens are display strings, one per position)."""

    prompt_tokens: list[str]
    tokens: list[str]
    step_map: list[int]
    confidence: list[float | None] | None = None
    token_ids: list[int] | None = None
    answer_length: int | None = None  # positions of the answer (incl. its first EOS); the rest is padding
    num_steps: int | None = None
    nfe: int | None = None
    text: str = ""
    label: str = ""
    finish_reason: str | None = None
    reward: float | None = None
    block_length: int | None = None  # draw a boundary every block_length positions...
    block_offset: int = 0  # ...counted from this offset (0: blocks of the completion; prompt length: SDAR blocks)
    extra: dict[str, Any] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)  # data: URIs of the prompt's images...
    image_positions: list[int] = field(default_factory=list)  # ...drawn before these prompt_tokens indices
    # uniform-state rollouts: per counted step {"step", "canvas", "self_conditioned", "ids", "tokens", "accepted"}
    # (positions inside the canvas of block_length tokens); the page then has one more step, the kept canvases
    uniform_steps: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.step_map):
            raise UserError(f"trace: {len(self.tokens)} tokens but {len(self.step_map)} step_map entries")
        if self.confidence is not None and len(self.confidence) != len(self.tokens):
            raise UserError(f"trace: {len(self.tokens)} tokens but {len(self.confidence)} confidences")
        self.step_map = [_step(s, j) for j, s in enumerate(self.step_map)]
        if self.answer_length is None:
            self.answer_length = len(self.tokens)
        if self.uniform_steps is not None:
            if not self.block_length:
                raise UserError("trace: uniform_steps need block_length, the canvas length")
            self.num_steps = len(self.uniform_steps) + 1
        if self.num_steps is None:
            self.num_steps = max([s + 1 for s in self.step_map if s >= 0], default=1)
        self.num_steps = max(1, int(self.num_steps))
        if self.confidence is not None:
            self.confidence = [None if c is None else float(c) for c in self.confidence]


def _step(value: Any, position: int) -> int:
    """One step_map entry: an integer (``-1``: never committed); anything else is the trace file's error."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value == int(value)):
        raise UserError(f"step_map[{position}] is {json.dumps(value)}; every position needs the integer step at "
                        "which its token was committed (-1: never)")
    return int(value)


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.decode([int(token_id)], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _first(obj: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if n in obj and obj[n] is not None:
            return obj[n]
    return None


def _uniform_from_json(steps: Any, tokenizer) -> list[dict[str, Any]] | None:
    if steps is None:
        return None
    if tokenizer is not None:
        return [{**s, "tokens": [_piece(tokenizer, t) for t in s["ids"]]} if s.get("ids") is not None else s
                for s in steps]
    return list(steps)


def normalize_trace(obj: Mapping[str, Any], tokenizer=None, label: str = "") -> TraceRecord:
    """A :class:`TraceRecord` from one JSON trace object (as ``dllm-rl generate --trace`` writes: ``prompt``,
    ``completion``, ``token_ids``, ``tokens``, ``steps``, ``confidence``, ``answer_length``, ``nfe``, ...).

    Accepts token strings (``prompt_tokens`` / ``completion_tokens`` or ``tokens``) or ids
    (``prompt_ids`` / ``completion_ids``, decoded with ``tokenizer``), a ``step_map``, and optional
    ``confidence``, ``completion_mask`` / ``length``, ``nfe``, ``text``, ``finish_reason``, ``reward``.
    """
    step_map = _first(obj, "step_map", "steps")
    if step_map is None:
        raise UserError("trace record has no step_map (the global step at which each token was committed)")
    ids = _first(obj, "completion_ids", "token_ids")
    # Token strings for display: decode the ids when a tokenizer is at hand (byte-level BPE pieces such as
    # "Ġthe" read better decoded), else the strings the trace carries.
    tokens = [_piece(tokenizer, t) for t in ids] if ids is not None and tokenizer is not None else None
    tokens = tokens if tokens is not None else _first(obj, "completion_tokens", "tokens")
    if tokens is None:
        if ids is None:
            raise UserError("trace record has neither completion tokens nor completion_ids")
        if tokenizer is None:
            raise UserError("trace record holds only token ids; pass a tokenizer (MODEL_DIR or --tokenizer)")
        tokens = [_piece(tokenizer, t) for t in ids]
    prompt_tokens = _first(obj, "prompt_tokens")
    if prompt_tokens is None:
        pids = _first(obj, "prompt_ids")
        if pids is not None and tokenizer is not None:
            prompt_tokens = [_piece(tokenizer, t) for t in pids]
        elif isinstance(obj.get("prompt"), str):
            prompt_tokens = [obj["prompt"]]
        else:
            prompt_tokens = []
    mask = _first(obj, "completion_mask")
    length = _first(obj, "answer_length", "length", "completion_length")
    if length is None and mask is not None:
        length = int(sum(int(bool(m)) for m in mask))
    known = {"step_map", "steps", "completion_ids", "token_ids", "completion_tokens", "tokens", "prompt_tokens",
             "prompt_ids", "completion_mask", "answer_length", "length", "completion_length", "confidence", "nfe",
             "num_steps", "text", "completion", "finish_reason", "reward", "label", "block_length",
             "block_offset", "uniform_steps"}
    reward = obj.get("reward")
    return TraceRecord(
        prompt_tokens=[str(t) for t in prompt_tokens],
        tokens=[str(t) for t in tokens],
        step_map=list(step_map),
        confidence=list(obj["confidence"]) if obj.get("confidence") is not None else None,
        token_ids=[int(t) for t in ids] if ids is not None else None,
        answer_length=int(length) if length is not None else None,
        num_steps=obj.get("num_steps"),
        nfe=int(obj["nfe"]) if obj.get("nfe") is not None else None,
        text=str(_first(obj, "text", "completion") or ""),
        label=str(obj.get("label") or label),
        finish_reason=obj.get("finish_reason"),
        reward=float(reward) if isinstance(reward, (int, float)) else None,
        block_length=obj.get("block_length"),
        block_offset=int(obj.get("block_offset") or 0),
        uniform_steps=_uniform_from_json(obj.get("uniform_steps"), tokenizer),
        extra={k: v for k, v in obj.items() if k not in known and isinstance(v, (str, int, float, bool))},
    )


def load_trace_jsonl(path: str | Path, tokenizer=None) -> list[TraceRecord]:
    """Read trace records from a JSON-lines file (one object per sequence)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: trace file not found")
    records = []
    for lineno, obj in iter_jsonl(path, objects=False):
        try:
            records.append(normalize_trace(obj, tokenizer, label=f"line {lineno}"))
        except ValueError as exc:
            raise UserError(f"{path}:{lineno}: {exc}") from None
    if not records:
        raise UserError(f"{path}: no trace records")
    return records


def image_data_uri(image) -> str:
    """A PIL image as a PNG ``data:`` URI, scaled down to :data:`THUMBNAIL` px on its longer side."""
    img = image.convert("RGB")
    img.thumbnail((THUMBNAIL, THUMBNAIL))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _prompt_with_images(tokenizer, pids: list[int], spans: Sequence[tuple[int, int]]) -> tuple[list[str], list[int]]:
    """Prompt token strings with each image's run of positions left out, and where each image is drawn."""
    tokens: list[str] = []
    where: list[int] = []
    skip = {o: n for o, n in spans}
    j = 0
    while j < len(pids):
        if j in skip:
            where.append(len(tokens))
            j += max(1, skip[j])
            continue
        tokens.append(_piece(tokenizer, pids[j]))
        j += 1
    return tokens, where


def records_from_rollout(rollout, tokenizer, labels: Sequence[str] | None = None, block_length: int | None = None,
                         block_offsets: Sequence[int] | None = None, images: Sequence[Sequence[Any]] | None = None,
                         image_spans: Sequence[Sequence[tuple[int, int]]] | None = None) -> list[TraceRecord]:
    """One :class:`TraceRecord` per sequence of a sampling ``Rollout`` (left padding of prompts dropped).

    ``block_length`` draws block boundaries every that many completion positions, shifted by
    ``block_offsets[b]`` (the prompt length for block-causal models, whose blocks count from the prompt's
    first token; none for semi-autoregressive blocks of the completion). ``images[b]`` (PIL images) are drawn in
    place of the prompt positions ``image_spans[b]`` (``(offset, length)`` in the prompt, one per image:
    :func:`dllm_rl.models.image_inputs.image_spans`).
    """
    out = []
    conf = getattr(rollout, "confidence", None)
    trace = getattr(rollout, "uniform", None)
    if trace is not None:  # a uniform-state rollout: its canvases are the blocks, counted from the completion
        from dllm_rl.sampling.uniform_rollout import uniform_steps

        block_length, block_offsets = trace.canvas_length, None
    for b in range(rollout.completion_ids.shape[0]):
        pmask = rollout.prompt_mask[b].bool()
        pids = rollout.prompt_ids[b][pmask].tolist()
        cids = rollout.completion_ids[b].tolist()
        spans = list(image_spans[b]) if image_spans is not None else []
        prompt_tokens, where = _prompt_with_images(tokenizer, pids, spans)
        pictures = [image_data_uri(img) for img in images[b]] if images is not None else []
        if len(pictures) != len(where):
            raise ValueError(f"sequence {b}: {len(pictures)} images for {len(where)} image spans")
        out.append(TraceRecord(
            prompt_tokens=prompt_tokens, images=pictures, image_positions=where,
            tokens=[_piece(tokenizer, t) for t in cids],
            step_map=rollout.step_map[b].tolist(),
            confidence=conf[b].float().tolist() if conf is not None else None,
            token_ids=cids,
            answer_length=int(rollout.completion_mask[b].sum()),
            nfe=int(rollout.nfe[b]),
            text=rollout.texts[b] if getattr(rollout, "texts", None) else "",
            label=labels[b] if labels is not None else f"sequence {b}",
            finish_reason=rollout.finish_reason[b] if getattr(rollout, "finish_reason", None) else None,
            block_length=block_length,
            block_offset=int(block_offsets[b]) if block_offsets is not None else 0,
            uniform_steps=uniform_steps(trace, b, lambda t: _piece(tokenizer, t)) if trace is not None else None,
        ))
    return out


def _template() -> str:
    return resources.files(__package__).joinpath("template.html").read_text(encoding="utf-8")


def render_html(records: Sequence[TraceRecord], title: str = "dllm-rl decoding trace",
                meta: Mapping[str, Any] | None = None, interval_ms: int = 350) -> str:
    """The viewer page with ``records`` embedded (self-contained: inline CSS/JS, no network)."""
    if not records:
        raise UserError("render_html: no trace records")
    meta_text = "  ".join(f"{k}: {v}" for k, v in (meta or {}).items())
    payload = {"records": [asdict(r) for r in records], "meta": dict(meta or {}), "meta_text": meta_text,
               "interval_ms": int(interval_ms)}
    # Strict JSON (the page parses it with JSON.parse): a NaN or infinite confidence or reward is written as the
    # string "NaN" / "Infinity", which the page shows as such. Inside <script>, "<" only occurs inside JSON
    # strings, where \u003c is the same character, so no string in the data can close the element or open a
    # comment.
    data = json.dumps(json_safe(payload), ensure_ascii=False, default=str, allow_nan=False).replace("<", "\\u003c")
    page = _template()
    page = page.replace("__TITLE__", html.escape(title))
    return page.replace("__TRACE_JSON__", data)


def write_html(path: str | Path, records: Sequence[TraceRecord], title: str = "dllm-rl decoding trace",
               meta: Mapping[str, Any] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(records, title=title, meta=meta), encoding="utf-8")
    return path
