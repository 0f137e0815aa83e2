"""SFT data: tokenization, chat template, padding, and bad rows counted / refused, never truncated."""

from __future__ import annotations

import json

import pytest

from dllm_rl.errors import UserError
from dllm_rl.models import char_tokenizer
from dllm_rl.models.tokenizer import CHATML_TEMPLATE
from dllm_rl.sft.data import DataConfig, collate, load_sft_data

EOS = 1  # char_tokenizer: <pad>=0 <eos>=1 <mask>=2 <unk>=3


def _write(tmp_path, lines):
    path = tmp_path / "d.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_prompt_response_tokens_and_eos_padding(tmp_path):
    tok = char_tokenizer("0123456789+=")
    path = _write(tmp_path, [{"prompt": "1+2=", "response": "3"}, {"prompt": "9=", "response": "10"}])
    ex, rep = load_sft_data(DataConfig(train_file=str(path), pad_response_to=4), tok, EOS, verbose=False)
    ids = {c: tok.convert_tokens_to_ids(c) for c in "01239+="}
    assert ex[0].prompt_ids == [ids["1"], ids["+"], ids["2"], ids["="]]
    assert ex[0].response_ids == [ids["3"], EOS, EOS, EOS]  # EOS-terminated, padded with EOS to 4
    assert ex[1].response_ids == [ids["1"], ids["0"], EOS, EOS]
    assert rep.kept == 2 and not rep.dropped
    b = collate(ex, pad_token_id=0)
    assert b.prompt_ids.tolist()[1] == [0, 0, ids["9"], ids["="]]  # left padded
    assert b.prompt_mask.tolist()[1] == [False, False, True, True]
    assert b.completion_mask.all()


def test_bad_rows_are_counted_and_skipped(tmp_path, capsys):
    tok = char_tokenizer("0123456789+=")
    path = _write(tmp_path, [
        {"prompt": "1+1=", "response": "2"},
        "{not json",
        {"prompt": "1+1="},
        {"question": "1+1=", "answer": "2"},
        {"prompt": "1+1=", "response": "  "},
        {"prompt": "1+1=", "response": "2" * 30},
        {"prompt": "1+1=", "response": "x"},
        {"prompt": 5, "response": "2"},
        {"prompt": "2+2=", "response": "4"},
    ])
    ex, rep = load_sft_data(DataConfig(train_file=str(path), max_length=16), tok, EOS)
    assert len(ex) == 2 and rep.read == 9 and rep.kept == 2
    assert dict(rep.dropped) == {"invalid_json": 1, "missing_field": 2, "empty_response": 1, "too_long": 1,
                                 "unknown_token": 1, "bad_field": 1}
    out = capsys.readouterr().out
    assert "read 9 rows, kept 2, dropped 7" in out
    assert f"{path}:2: invalid JSON" in out and f"{path}:6: prompt + response = 35 tokens > data.max_length=16" in out
    # never truncated: the long row is gone, not cut
    assert all(len(e.response_ids) <= 2 for e in ex)


def test_bad_rows_refused_with_file_and_line(tmp_path):
    tok = char_tokenizer("0123456789+=")
    path = _write(tmp_path, [{"prompt": "1=", "response": "1"}, {"prompt": "1=", "response": ""}])
    with pytest.raises(UserError, match=r"d.jsonl:2: empty response"):
        load_sft_data(DataConfig(train_file=str(path), on_bad_row="error"), tok, EOS, verbose=False)
    with pytest.raises(UserError, match="no usable rows"):
        load_sft_data(DataConfig(train_file=str(_write(tmp_path, [{"a": 1}]))), tok, EOS, verbose=False)
    with pytest.raises(FileNotFoundError, match="train_file"):
        load_sft_data(DataConfig(train_file=str(tmp_path / "missing.jsonl")), tok, EOS, verbose=False)


def test_response_longer_than_pad_length_is_dropped(tmp_path):
    tok = char_tokenizer("0123456789+=")
    path = _write(tmp_path, [{"prompt": "1=", "response": "123"}, {"prompt": "1=", "response": "12"}])
    ex, rep = load_sft_data(DataConfig(train_file=str(path), pad_response_to=3), tok, EOS, verbose=False)
    assert len(ex) == 1 and rep.dropped["too_long"] == 1  # "123" + eos = 4 tokens > 3


def test_chat_template_and_messages(tmp_path):
    tok = char_tokenizer(chat_template=CHATML_TEMPLATE,
                         alphabet="0123456789+=<>|_ \nabcdefghijklmnopqrstuvwxyz")
    path = _write(tmp_path, [
        {"prompt": "hi", "response": "yo"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"messages": [{"role": "user", "content": "hi"}]},
    ])
    ex, rep = load_sft_data(DataConfig(train_file=str(path)), tok, EOS, verbose=False)
    assert rep.dropped == {"bad_messages": 1}
    prompt = tok.decode(ex[0].prompt_ids)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ex[0].response_ids[:-1]) == "yo<|im_end|>\n" and ex[0].response_ids[-1] == EOS
    assert ex[1].prompt_ids == ex[0].prompt_ids and ex[1].response_ids == ex[0].response_ids
    plain, _ = load_sft_data(DataConfig(train_file=str(path), chat_template="never"), tok, EOS, verbose=False)
    assert tok.decode(plain[0].prompt_ids) == "hi"
    with pytest.raises(ValueError, match="no chat template"):
        load_sft_data(DataConfig(train_file=str(path), chat_template="always"), char_tokenizer(), EOS)


def test_step_maps_and_trace_files(tmp_path):
    tok = char_tokenizer("0123456789+=")
    path = _write(tmp_path, [{"prompt": "1=", "response": "12", "steps": [1, 0, 2]},
                             {"prompt": "1=", "response": "12", "steps": [1, 0]},
                             # a `dllm-rl generate --trace` record: response ids verbatim, no EOS appended
                             {"prompt": "1=", "completion": "2", "token_ids": [6, 1, 1, 1], "steps": [0, 1, 1, 2]},
                             {"prompt": "1=", "token_ids": [6, 99], "steps": [0, 1]}])
    ex, rep = load_sft_data(DataConfig(train_file=str(path)), tok, EOS, verbose=False)
    assert rep.dropped == {"bad_step_map": 1, "bad_field": 1} and ex[0].step_map == [1, 0, 2]
    assert ex[1].response_ids == [6, 1, 1, 1] and ex[1].step_map == [0, 1, 1, 2]
    assert ex[1].prompt_ids == ex[0].prompt_ids
    b = collate(ex, 0)
    assert b.step_map.tolist() == [[1, 0, 2, -1], [0, 1, 1, 2]]


def test_task_rows_countdown_compact(tmp_path):
    from dllm_rl.tasks.synthetic import make_countdown

    rows = make_countdown(3, seed=0, max_value=10) + [{"nums": [1, 2], "target": "x"}]
    path = _write(tmp_path, rows)
    tok = char_tokenizer()
    cfg = DataConfig(train_file=str(path), task="countdown", prompt_style="compact")
    ex, rep = load_sft_data(cfg, tok, EOS, verbose=False)
    assert rep.kept == 3 and rep.dropped == {"bad_field": 1}
    r = rows[0]
    assert tok.decode(ex[0].prompt_ids) == f"nums {' '.join(map(str, r['nums']))} target {r['target']}\n"
    assert tok.decode(ex[0].response_ids[:-1]) == f"<answer>{r['solution']}</answer>"


def test_non_utf8_row_is_skipped_and_counted_or_refused_with_file_and_line(tmp_path):
    tok = char_tokenizer("0123456789+=")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "response": "2"}\n{"prompt": "caf\xe9", "response": "1"}\n'
                     b'{"prompt": "2+2=", "response": "4"}\n')
    ex, rep = load_sft_data(DataConfig(train_file=str(path)), tok, EOS, verbose=False)
    assert len(ex) == 2 and (rep.read, rep.kept, dict(rep.dropped)) == (3, 2, {"not_utf8": 1})
    assert rep.messages == [f"{path}:2: not UTF-8 text (byte 0xe9 at column 16); save the file as UTF-8"]
    with pytest.raises(ValueError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9 at column 16\); save the file as "
                                         r"UTF-8 \(set data.on_bad_row=skip to skip such rows\)$"):
        load_sft_data(DataConfig(train_file=str(path), on_bad_row="error"), tok, EOS, verbose=False)
    # a bad line past data.limit is never read
    ex, rep = load_sft_data(DataConfig(train_file=str(path), limit=1, on_bad_row="error"), tok, EOS, verbose=False)
    assert (len(ex), rep.read, dict(rep.dropped)) == (1, 1, {})


def test_csv_and_parquet_tables_are_read_like_json_lines(tmp_path):
    """SFT used to read every file as JSON lines (a CSV or Parquet file: a traceback); tables now go through the
    task data reader, with the same tokens as the JSON-lines file and their own file and line in messages."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tok = char_tokenizer("0123456789+=")
    rows = [{"prompt": "1+1=", "response": "2"}, {"prompt": "2+3=", "response": "5"}, {"prompt": "9=", "response": ""}]
    jsonl = load_sft_data(DataConfig(train_file=str(_write(tmp_path, rows))), tok, EOS, verbose=False)[0]
    (tmp_path / "d.csv").write_text("prompt,response\n1+1=,2\n2+3=,5\n9=,\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        ex, rep = load_sft_data(DataConfig(train_file=str(tmp_path / name)), tok, EOS, verbose=False)
        assert [(e.prompt_ids, e.response_ids) for e in ex] == [(e.prompt_ids, e.response_ids) for e in jsonl]
        assert rep.read == 3 and rep.kept == 2 and dict(rep.dropped) == {"empty_response": 1}
    with pytest.raises(UserError, match=r"d.csv, line 4: empty response \(set data.on_bad_row=skip"):
        load_sft_data(DataConfig(train_file=str(tmp_path / "d.csv"), on_bad_row="error"), tok, EOS, verbose=False)
