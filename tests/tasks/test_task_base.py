"""Task base: Score, data loading, malformed rows, registry, prompts, TRL reward signature."""

from __future__ import annotations

import gzip
import json
import pickle
import sys

import pytest

from dllm_rl.tasks import DataError, Score, Task, completion_text, get_task, list_tasks, register_task
from dllm_rl.tasks.base import read_rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_score_is_a_float_with_reason_and_survives_pickle():
    s = Score(0.5, "half", solved=False)
    assert isinstance(s, float) and s == 0.5 and s + 1 == 1.5
    assert s.reason == "half" and s.info == {"solved": False}
    t = pickle.loads(pickle.dumps(s))
    assert t == 0.5 and t.reason == "half" and t.info == {"solved": False}


@pytest.mark.parametrize(
    "completion, text",
    [
        ("abc", "abc"),
        (None, ""),
        (b"\xffab", "\ufffdab"),
        ([{"role": "assistant", "content": "hi"}], "hi"),
        ({"content": "x"}, "x"),
        ([], ""),
    ],
)
def test_completion_text_accepts_trl_formats(completion, text):
    assert completion_text(completion) == text


def test_load_formats_keep_raw_columns(tmp_path):
    rows = [{"question": "1+1?", "answer": "so #### 2", "extra": 7}]
    jl = write_jsonl(tmp_path / "a.jsonl", rows)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(jl.read_bytes()))
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps(rows))
    csv = tmp_path / "a.csv"
    csv.write_text("question,answer,extra\n1+1?,so #### 2,7\n")
    for f in (jl, gz, arr, csv):
        task = get_task(str(f), task_type="gsm8k")
        (ex,) = task.examples
        assert ex["final_answer"] == "2" and str(ex["extra"]) == "7" and ex["question"] == "1+1?"
        assert ex["prompt"].startswith("1+1?") and "\\boxed{}" in ex["prompt"]


def test_missing_field_error_names_file_line_and_field(tmp_path):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q2"}])
    with pytest.raises(DataError, match=r"bad\.jsonl, line 2: missing field 'final_answer' or 'answer'"):
        get_task(str(f), task_type="gsm8k").load()
    c = tmp_path / "bad.csv"
    c.write_text("Puzzle,Solution\n3102200002100320,3142243142131324\n3102200002100320,\n")
    with pytest.raises(DataError, match=r"bad\.csv, line 3: 'puzzle' and 'solution'"):
        get_task(str(c), task_type="sudoku").load()
    j = tmp_path / "broken.jsonl"
    j.write_text('{"input": "1,2", "output": "3"}\n{"input": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl, line 2: invalid JSON"):
        get_task(str(j), task_type="countdown").load()
    with pytest.raises(DataError, match=r"line 1: missing field 'target' or 'output'"):
        get_task(str(write_jsonl(tmp_path / "cd.jsonl", [{"input": "1,2"}])), task_type="countdown").load()


def test_parquet_and_hf_need_their_packages(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="needs the `datasets` package"):
        list(read_rows("hf:openai/gsm8k:main@test"))
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed; parquet round trip skipped")
    import pyarrow as pa

    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist([{"input": "1,2", "output": "3"}]), path)
    assert get_task(str(path), task_type="countdown").examples[0]["nums"] == [1, 2]


def test_registry_and_errors(tmp_path):
    assert {"gsm8k", "math", "countdown", "sudoku", "code", "arith", "humaneval", "mbpp"} <= set(list_tasks())
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    f = write_jsonl(tmp_path / "x.jsonl", [{"input": "1,2", "output": "3"}])
    with pytest.raises(ValueError, match="pass task_type="):
        get_task(str(f))
    with pytest.raises(FileNotFoundError):
        get_task(str(tmp_path / "missing.jsonl"), task_type="countdown")
    with pytest.raises(ValueError, match="no prompt_style 'compact'"):
        get_task("gsm8k", prompt_style="compact")
    # a task name as the reward selects that task's scoring for a file
    t = get_task(str(f), reward="countdown", prompt_style="compact")
    assert t.name == "countdown" and t.examples[0]["prompt"] == "nums 1 2 target 3\n"

    class Echo(Task):
        name = "echo"
        required_fields = ("q",)

        def format_prompt(self, example):
            return example["q"]

        def _score(self, text, example):
            return Score(float(text == example["q"]), "echo")

    register_task("echo", Echo)
    e = get_task("echo", data=[{"q": "hi"}])
    assert e.score_examples(["hi", "no"], e.examples * 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 completions for 1 examples"):
        e.score_examples(["hi", "no"], e.examples)


def test_reward_fn_has_trl_signature_and_ignores_extra_kwargs():
    task = get_task("countdown", data=[{"input": "3,5,7", "output": "22"}, {"input": "1,2", "output": "3"}])
    fn = task.reward_fn
    assert fn.__name__ == "countdown_reward"
    cols = {k: [ex[k] for ex in task.examples] for k in ("nums", "target", "input", "output")}
    out = fn(
        [ex["prompt"] for ex in task.examples],
        [[{"role": "assistant", "content": "<answer>3*5+7</answer>"}], "<answer>1-2</answer>"],
        completion_ids=[[1], [2]],
        trainer_state=object(),
        **cols,
    )
    assert out == [1.0, 0.0] and all(isinstance(s, Score) and s.reason for s in out)
    assert "equals -1" in out[1].reason


def test_custom_trl_reward_function_plugs_in(tmp_path):
    def length_reward(prompts, completions, **kwargs):
        assert kwargs["target"] == [3]
        return [len(c) / 10 for c in completions]

    f = write_jsonl(tmp_path / "x.jsonl", [{"input": "1,2", "output": "3"}])
    t = get_task(str(f), task_type="countdown", reward=length_reward)
    (s,) = t.score_examples(["abcde"], t.examples)
    assert s == 0.5 and s.reason == "length_reward"


class FakeTokenizer:
    chat_template = "fake"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_build_prompt_chat_template_plain_and_compact():
    rows = [{"input": "3,5,7", "output": "22"}]
    chat = get_task("countdown", data=rows, system_prompt="Be brief.")
    ex = chat.examples[0]
    assert chat.build_prompt(ex, FakeTokenizer()).startswith(
        "<system>Be brief.<user>Using the numbers [3, 5, 7]"
    )
    assert chat.build_prompt(ex) == "Be brief.\n\n" + ex["prompt"]
    plain = get_task("countdown", data=rows, prompt_style="plain")
    assert plain.build_prompt(plain.examples[0], FakeTokenizer()) == plain.examples[0]["prompt"]
    compact = get_task("countdown", data=rows, prompt_style="compact", system_prompt="ignored")
    assert compact.build_prompt(compact.examples[0], FakeTokenizer()) == "nums 3 5 7 target 22\n"


def test_non_utf8_byte_in_a_data_file_names_file_and_line(tmp_path):
    j = tmp_path / "latin1.jsonl"
    j.write_bytes(b'{"input": "1,2", "output": "3"}\n{"input": "1,2", "output": "3", "note": "caf\xe9"}\n')
    with pytest.raises(DataError, match=rf"^{j}, line 2: not UTF-8 text \(byte 0xe9 at column 45\); save the file as "
                                        r"UTF-8$"):
        get_task(str(j), task_type="countdown").load()
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"input": "1,2", "output": "3"}\n{"input": "1,')  # a data file's broken last row: an error
    with pytest.raises(DataError, match=rf"^{torn}, line 2: invalid JSON"):
        get_task(str(torn), task_type="countdown").load()
