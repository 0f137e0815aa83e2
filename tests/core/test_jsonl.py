"""The one JSON-lines reader/writer: a torn last line dropped with a warning, bad lines named by file and line."""

from __future__ import annotations

import gzip
import logging
import os

import pytest

from dllm_rl.jsonl import (
    JSONLError,
    append_jsonl,
    iter_jsonl,
    keep_rows_through,
    read_jsonl,
    repair_jsonl,
    write_jsonl,
)


def test_rows_with_line_numbers_blank_lines_bom_and_gzip(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n  \n{"a": "\xc3\xa9"}\r\n{"a": 3}')  # BOM, CRLF, no final newline
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"a": "é"}), (5, {"a": 3})]
    gz = tmp_path / "b.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b'{"x": 1}\n{"x": 2}\n')
    assert read_jsonl(gz) == [{"x": 1}, {"x": 2}]
    assert write_jsonl(tmp_path / "c.jsonl", [[1, 2], "x"]) == 2
    assert read_jsonl(tmp_path / "c.jsonl", objects=False) == [[1, 2], "x"]


def test_torn_last_line_is_dropped_with_a_warning_or_an_error(tmp_path, caplog):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    with caplog.at_level(logging.WARNING, logger="dllm_rl.jsonl"):
        assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert f"{path}:3: dropped a torn last line" in caplog.text
    with pytest.raises(JSONLError, match=rf"^{path}:3: invalid JSON: Unterminated string starting at \(column 13\)$"):
        read_jsonl(path, torn_last_line="error")


def test_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    message = rf"^{path}:2: invalid JSON: Unterminated string starting at \(column 13\)$"
    with pytest.raises(JSONLError, match=message) as info:
        read_jsonl(path)
    assert (info.value.line, info.value.reason) == (2, "invalid_json")
    path.write_text('{"step": 1}\n[1]\n')
    with pytest.raises(JSONLError, match=rf"^{path}:2: expected a JSON object, got list$"):
        read_jsonl(path)
    # a complete last line that is bad (it ends with a newline) is no torn write
    path.write_text('{"step": 1}\n{"step": 2\n')
    with pytest.raises(JSONLError, match=rf"^{path}:2: invalid JSON"):
        read_jsonl(path)


def test_non_utf8_byte_names_file_line_and_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n{"a": 3}\n')
    with pytest.raises(JSONLError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9 at column 11\); save the file as"):
        read_jsonl(path)
    seen = []
    assert read_jsonl(path, on_error=seen.append) == [{"a": 1}, {"a": 3}]
    assert [(e.line, e.reason) for e in seen] == [(2, "not_utf8")]


def test_append_and_atomic_rewrite(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "r.jsonl"
    assert append_jsonl(path, [{"step": 1}, {"step": 2, "p": "é"}]) == 2
    assert append_jsonl(path, [{"step": 3, "where": tmp_path}], fsync=True) == 1
    assert path.read_text(encoding="utf-8").splitlines()[1] == '{"step": 2, "p": "é"}'
    assert read_jsonl(path)[2] == {"step": 3, "where": str(tmp_path)}
    with path.open("a") as f:
        f.write('{"step": 4, "x')  # torn by a crash
    assert keep_rows_through(path, 2) == 2
    assert path.read_text() == '{"step": 1}\n{"step": 2, "p": "é"}\n'
    # a crash inside a rewrite leaves the old file whole and no temporary file behind

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_jsonl(path, [{"step": 9}])
    assert path.read_text() == '{"step": 1}\n{"step": 2, "p": "é"}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.jsonl"]
    assert keep_rows_through(tmp_path / "none.jsonl", 3) == 0 and not (tmp_path / "none.jsonl").exists()


def test_repair_drops_a_torn_tail_from_the_file_before_appending(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}')  # the last line parses but has no newline: kept, newline added
    assert repair_jsonl(path) == [{"i": 0}, {"i": 1}] and path.read_text() == '{"i": 0}\n{"i": 1}\n'
    append_jsonl(path, [{"i": 2}])
    with path.open("a") as f:
        f.write('{"i": 3, "x')
    assert repair_jsonl(path) == [{"i": 0}, {"i": 1}, {"i": 2}]
    append_jsonl(path, [{"i": 3}])
    assert read_jsonl(path, torn_last_line="error") == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert repair_jsonl(empty) == [] and empty.read_text() == ""
