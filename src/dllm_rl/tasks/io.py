"""Where task data comes from, and the file readers.

A named task's default data for a split is looked up in this order (:func:`default_source`):

1. the files bundled with the package (``dllm_rl/assets/data/``, listed in its README): the complete
   Countdown (cd3) and 4x4 Sudoku test sets and HumanEval;
2. the benchmark-data folder, an optional cache: ``$DLLM_RL_DATA``, else ``<repo>/../shared/data``;
3. the task's canonical Hugging Face dataset (``hf:owner/name[:config][@split]``), through ``datasets``
   from a snapshot in the hub cache (:func:`dllm_rl.hub.resolve_dataset_repo`: ``HF_HOME``,
   ``HF_HUB_OFFLINE``).

Readers: local ``.jsonl`` / ``.jsonl.gz`` / ``.json`` / ``.csv`` / ``.parquet`` files and hub datasets. Bad
rows raise :class:`DataError` naming the file, line and field.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from dllm_rl.errors import UserError
from dllm_rl.jsonl import JSONLError, iter_jsonl

#: files shipped inside the package (same relative names as in the benchmark-data folder)
ASSETS_DATA = Path(__file__).resolve().parents[1] / "assets" / "data"


class DataError(UserError):
    """A dataset row or file is malformed; the message names the file, line and field."""


def find_data_dir() -> Path | None:
    """The benchmark-data folder (an optional cache): ``$DLLM_RL_DATA`` if set, else
    ``<repo>/../shared/data``; None when neither exists."""
    env = os.environ.get("DLLM_RL_DATA")
    if env:
        p = Path(env).expanduser()
        return p if p.is_dir() else None
    repo = Path(__file__).resolve().parents[3]
    p = (repo / ".." / "shared" / "data").resolve()
    return p if p.is_dir() else None


def bundled_file(relpath: str) -> Path | None:
    """The file ``relpath`` shipped in ``dllm_rl/assets/data`` (None when not shipped)."""
    path = ASSETS_DATA / relpath
    return path if path.is_file() else None


def default_source(relpath: str | None, hub: str | None, what: str) -> Path | str:
    """Where ``what`` (e.g. ``"task 'gsm8k', split 'test'"``) is read from: the bundled file ``relpath``, the
    same file in the benchmark-data folder, else the hub dataset ``hub`` (see the module docs)."""
    if relpath is not None:
        found = bundled_file(relpath)
        root = find_data_dir()
        if found is None and root is not None and (root / relpath).is_file():
            found = root / relpath
        if found is not None:
            return found
    if hub is not None:
        return hub
    raise FileNotFoundError(
        f"{what}: no data: {relpath!r} is neither bundled nor in the benchmark-data folder ($DLLM_RL_DATA or "
        "<repo>/../shared/data), and the task has no hub dataset; pass data=<file>")


def data_file(relpath: str) -> Path:
    """A bundled file, or one in the benchmark-data folder; FileNotFoundError with what to do when absent."""
    return Path(default_source(relpath, None, f"data file {relpath!r}"))


def is_hf_name(source: str) -> bool:
    """True for ``hf:...`` names, and for ``owner/name`` strings that are not local files and have no
    file suffix."""
    if source.startswith("hf:"):
        return True
    p = Path(source)
    return not p.exists() and source.count("/") == 1 and not p.suffix and not source.startswith((".", "/"))


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_rows(source: str | os.PathLike, *, split: str | None = None) -> Iterator[tuple[str, dict]]:
    """Yield ``(location, row)`` for every row of a data file (``location`` = ``file:line``) or of a
    Hugging Face dataset. Raises DataError / FileNotFoundError with the file and line on problems."""
    text = str(source)
    if is_hf_name(text):
        yield from _read_hf(text, split)
        return
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        yield from _read_jsonl(path)
    elif name.endswith(".parquet"):
        yield from _read_parquet(path)
    elif name.endswith((".json", ".json.gz", ".csv", ".csv.gz", ".tsv")):
        try:
            yield from _read_text_rows(path, name)
        except UnicodeDecodeError:
            raise DataError(f"{path}, line {_first_non_utf8_line(path)}: not UTF-8 text; save the file as UTF-8") \
                from None
    else:
        suffixes = "".join(path.suffixes[-2:]).lower()
        raise DataError(
            f"{path}: unsupported data file type {suffixes or path.suffix!r} "
            "(use .jsonl, .jsonl.gz, .json, .csv or .parquet)"
        )


def _read_text_rows(path: Path, name: str) -> Iterator[tuple[str, dict]]:
    """Rows of a ``.json`` (an array, else JSON lines) or ``.csv`` / ``.tsv`` file."""
    if name.endswith((".json", ".json.gz")):
        with _open_text(path) as f:
            head = f.read(1 << 16).lstrip()
        if not head.startswith("["):
            yield from _read_jsonl(path)
            return
        with _open_text(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}, line {exc.lineno}: invalid JSON ({exc.msg})") from exc
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise DataError(f"{path}, item {i}: expected a JSON object, got {type(row).__name__}")
            yield f"{path}, item {i}", row
        return
    with _open_text(path) as f:
        reader = csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",")
        if not reader.fieldnames:
            raise DataError(f"{path}, line 1: empty CSV file (no header line)")
        for row in reader:
            if None in row:
                raise DataError(f"{path}, line {reader.line_num}: more values than header columns")
            yield f"{path}, line {reader.line_num}", dict(row)


def _first_non_utf8_line(path: Path) -> int:
    """The line of a text file holding its first byte that is not UTF-8 (read again only after a decode
    error, so the readers stay streaming)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return n
    return n


def _read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """A data file's rows (a broken last line is an error too: someone wrote this file)."""
    try:
        for n, row in iter_jsonl(path, torn_last_line="error"):
            yield f"{path}, line {n}", row
    except JSONLError as err:
        raise DataError(f"{err.path}, line {err.line}: {err.detail}") from None


def _read_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        import pyarrow as pa

        errors: tuple[type[BaseException], ...] = (pa.ArrowException, ValueError, OSError)
    except ImportError:
        errors = (ValueError, OSError)
    try:
        rows = _parquet_rows(path)
    except errors as exc:  # not Parquet, truncated, corrupt pages
        detail = " ".join(str(exc).split())
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {detail}); is it truncated or "
                        "corrupt?") from None
    for i, row in enumerate(rows):
        yield f"{path}, row {i}", dict(row)


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        return pq.read_table(path).to_pylist()
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow) or pandas") from exc
    return pd.read_parquet(path).to_dict(orient="records")


def _read_hf(name: str, split: str | None) -> Iterator[tuple[str, dict]]:
    """Rows of ``hf:owner/name[:config][@split]``: the dataset repository's snapshot in the hub cache (downloaded
    unless ``HF_HUB_OFFLINE``), loaded with ``datasets`` from that folder."""
    from dllm_rl.hub import resolve_dataset_repo

    spec = name[3:] if name.startswith("hf:") else name
    spec, _, hf_split = spec.partition("@")
    spec, _, config = spec.partition(":")
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading the Hugging Face dataset {spec!r} needs the `datasets` package (pip install datasets); "
            "or pass a local .jsonl / .csv / .parquet file"
        ) from exc
    folder = resolve_dataset_repo(spec)
    want = hf_split or split or "train"
    try:
        ds = datasets.load_dataset(str(folder), config or None, split=want)
    except ValueError as exc:  # an unknown config or split: say which the snapshot has
        raise DataError(f"hf:{spec}: cannot load config {config or 'default'!r}, split {want!r} from {folder}: "
                        f"{exc}") from None
    for i, row in enumerate(ds):
        yield f"hf:{spec}[{i}]", dict(row)
