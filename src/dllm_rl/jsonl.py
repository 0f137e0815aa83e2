"""JSON lines: the one reader and writer of every ``.jsonl`` file the project reads or writes.

One rule for damage, whatever the file:

- a bad line (not UTF-8, not JSON, not a JSON object) is an error naming the file and the line
  (:class:`JSONLError`, a ``UserError``), or, with ``on_error``, handed to that callback and skipped;
- a *torn last line* -- the bytes after the file's last newline that do not parse, which is what a crash in
  the middle of an append leaves -- is dropped with a warning (``torn_last_line="drop"``, for the files a run
  writes: metrics, rollouts, evaluation items, traces) or treated like any bad line (``"error"``, for data
  files a person wrote, where a broken last row is a mistake to report);
- blank lines are skipped; line numbers count every line from 1; a UTF-8 byte-order mark is ignored;
  ``.gz`` files are read through gzip.

Writers: :func:`append_jsonl` appends rows in one write (optionally fsync'ed: a kill then loses at most the
rows of that call); :func:`write_jsonl` replaces a whole file atomically (temporary file in the same folder,
fsync, rename), so a crash during a rewrite (e.g. the truncation of a resumed run's metrics) leaves either the
old file or the new one, never a mix. Every row is serialised the same way (:func:`dumps`).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from dllm_rl.errors import UserError

logger = logging.getLogger(__name__)
TornRule = Literal["drop", "error"]


class JSONLError(UserError):
    """A bad line of a JSON-lines file: ``path``, ``line`` (1-based), ``reason`` (``not_utf8`` |
    ``invalid_json`` | ``not_object``) and ``detail`` (what was wrong, without the location)."""

    def __init__(self, path: Path, line: int, reason: str, detail: str):
        super().__init__(f"{path}:{line}: {detail}")
        self.path, self.line, self.reason, self.detail = path, line, reason, detail


def dumps(row: Any) -> str:
    """One row as a JSON line (newline included): UTF-8 text, non-JSON values (paths, ...) as strings."""
    return json.dumps(row, ensure_ascii=False, default=str) + "\n"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by the string JavaScript prints for it (``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``), recursively through dicts, lists and tuples: JSON has no such numbers, so
    ``json.dumps`` would write bare ``NaN``, which a strict parser (a browser's ``JSON.parse``) rejects."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _parse(path: Path, n: int, raw: bytes, objects: bool) -> Any:
    try:
        text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise JSONLError(path, n, "not_utf8", f"not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                                              f"{exc.start + 1}); save the file as UTF-8") from None
    try:
        row = json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        raise JSONLError(path, n, "invalid_json", f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if objects and not isinstance(row, dict):
        raise JSONLError(path, n, "not_object", f"expected a JSON object, got {type(row).__name__}")
    return row


def iter_jsonl(path: str | os.PathLike, *, torn_last_line: TornRule = "drop", objects: bool = True,
               on_error: Callable[[JSONLError], None] | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, row)`` for every non-blank line of ``path`` (see the module docstring).

    ``objects``: every row must be a JSON object. ``on_error``: called with each bad line's
    :class:`JSONLError` instead of raising it (the line is skipped).
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = _parse(path, n, raw, objects)
            except JSONLError as err:
                if not raw.endswith(b"\n") and torn_last_line == "drop":
                    logger.warning("%s:%d: dropped a torn last line (a write cut short, e.g. by a crash): %s",
                                   path, n, err.detail)
                    return
                if on_error is None:
                    raise
                on_error(err)
                continue
            yield n, row


def read_jsonl(path: str | os.PathLike, *, torn_last_line: TornRule = "drop", objects: bool = True,
               on_error: Callable[[JSONLError], None] | None = None) -> list[Any]:
    """All rows of ``path`` as a list (the rules of :func:`iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path, torn_last_line=torn_last_line, objects=objects, on_error=on_error)]


def fsync_path(path: str | os.PathLike) -> None:
    """Force a file's data, or a folder's entries (a rename in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_jsonl(path: str | os.PathLike, rows: Iterable[Any], *, fsync: bool = False) -> int:
    """Append ``rows`` to ``path`` in one write (parent folders created); returns how many.

    ``fsync``: force them to disk before returning (a results file that a kill must not lose)."""
    path = Path(path)
    text = "".join(dumps(r) for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return text.count("\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> int:
    """Replace ``path`` with ``rows`` atomically (temp file in the same folder, fsync, rename); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(dumps(r))
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return n


def repair_jsonl(path: str | os.PathLike) -> list[Any]:
    """The rows of a file about to be appended to; a torn last line is dropped from the file too (an atomic
    rewrite, only when the file does not end with a newline), so the next row starts on a line of its own."""
    path = Path(path)
    rows = read_jsonl(path)
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(size - 1, 0))
        last = f.read(1)
    if size and last != b"\n":
        write_jsonl(path, rows)
    return rows


def keep_rows_through(path: str | os.PathLike, step: int) -> int:
    """Rewrite a run's JSON-lines log keeping the rows of steps up to ``step`` (a run resumed at ``step``
    rewrites the later ones, so the file never holds two histories); a torn last line goes too. Returns
    the rows kept (0 when there is no file)."""
    path = Path(path)
    if not path.is_file():
        return 0
    return write_jsonl(path, [r for r in read_jsonl(path) if int(r.get("step", 0)) <= step])
