"""Synthetic generators and `dllm-rl data`: determinism, distinct and solvable rows, disjoint splits."""

from __future__ import annotations

import pytest
from data_cli import read_rows, run_cli

from dllm_rl.tasks import get_task
from dllm_rl.tasks.arith import evaluate_arith
from dllm_rl.tasks.countdown import check_countdown
from dllm_rl.tasks.sudoku import count_solutions, is_valid_solution
from dllm_rl.tasks.synthetic import make, make_split_pair, row_key


def test_countdown_rows_are_distinct_solvable_and_follow_the_knobs():
    rows = make("countdown", 300, seed=1, numbers=4, max_value=30)
    assert len({row_key("countdown", r) for r in rows}) == 300
    for r in rows:
        assert len(r["nums"]) == 4 and all(1 <= v <= 30 for v in r["nums"]) and 1 <= r["target"] <= 30
        assert check_countdown(r["solution"], r["nums"], r["target"])[0], r
        assert r["input"] == ",".join(map(str, r["nums"])) and r["output"] == str(r["target"])
    assert make("countdown", 50, seed=1, numbers=4, max_value=30) == rows[:50]  # reproducible
    assert make("countdown", 50, seed=2, numbers=4, max_value=30) != rows[:50]
    task = get_task("countdown", data=rows, prompt_style="compact")
    scores = task.score_examples([task.reference_completion(ex) for ex in task.examples], task.examples)
    assert all(s == 1.0 for s in scores)


def test_sudoku_rows_have_unique_solutions_and_the_requested_blanks():
    rows = make("sudoku", 100, seed=0, blanks=10)
    assert len({r["puzzle"] for r in rows}) == 100
    for r in rows:
        assert r["puzzle"].count("0") == 10
        assert is_valid_solution(r["solution"], r["puzzle"]) and count_solutions(r["puzzle"], 2) == 1
    task = get_task("sudoku", data=rows)
    assert all(task.score_one(task.reference_completion(ex), ex).info["solved"] for ex in task.examples)


def test_arith_values_and_difficulty_presets():
    rows = make("arith", 200, seed=0, difficulty="hard")
    for r in rows:
        nums = r["expression"].replace("+", " ").replace("-", " ").replace("*", " ").split()
        assert len(nums) == 4 and all(len(n) == 3 for n in nums)
        assert r["answer"] == evaluate_arith(r["expression"])  # independent AST evaluator
    easy = make("arith", 20, seed=0, difficulty="easy", operands=3)  # explicit knobs override the preset
    assert all(len(r["expression"]) == 5 for r in easy)
    with pytest.raises(ValueError, match="could only make 300 distinct arith rows"):
        make("arith", 400, seed=0, operands=2, digits=1)


def test_split_pair_is_disjoint():
    train, test = make_split_pair("countdown", 500, 100, seed=0, difficulty="easy")
    keys_train = {row_key("countdown", r) for r in train}
    keys_test = {row_key("countdown", r) for r in test}
    assert len(keys_train) == 500 and len(keys_test) == 100 and not keys_train & keys_test


def test_cli_make_with_exclude_and_test_out(tmp_path, capsys):
    test_f, train_f, more_f = tmp_path / "test.jsonl", tmp_path / "train.jsonl", tmp_path / "more.jsonl"
    assert (
        run_cli(
            "data", "make", "sudoku", "--n", "40", "--split", "test", "--blanks", "6", "--out", str(test_f)
        )
        == 0
    )
    assert (
        run_cli(
            "data",
            "make",
            "sudoku",
            "--n",
            "200",
            "--blanks",
            "6",
            "--exclude",
            str(test_f),
            "--out",
            str(train_f),
        )
        == 0
    )
    test_keys = {r["puzzle"] for r in read_rows(test_f)}
    train_keys = {r["puzzle"] for r in read_rows(train_f)}
    assert len(test_keys) == 40 and len(train_keys) == 200 and not test_keys & train_keys
    assert (
        run_cli(
            "data",
            "make",
            "arith",
            "--n",
            "30",
            "--out",
            str(more_f),
            "--test-out",
            str(tmp_path / "t.jsonl"),
            "--test-n",
            "10",
            "--digits",
            "1",
        )
        == 0
    )
    assert len(read_rows(more_f)) == 30 and len(read_rows(tmp_path / "t.jsonl")) == 10
    assert "wrote 200 sudoku train rows" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="--exclude file"):
        run_cli(
            "data",
            "make",
            "arith",
            "--n",
            "3",
            "--out",
            str(more_f),
            "--exclude",
            str(tmp_path / "none.jsonl"),
        )
    with pytest.raises(ValueError, match="--blanks"):
        run_cli("data", "make", "sudoku", "--n", "3", "--blanks", "16", "--out", str(more_f))


def test_cli_show_prints_prompts_and_rewards(tmp_path, capsys):
    f = tmp_path / "cd.jsonl"
    run_cli("data", "make", "countdown", "--n", "3", "--out", str(f))
    assert (
        run_cli("data", "show", str(f), "--task-type", "countdown", "--prompt-style", "compact", "--n", "2")
        == 0
    )
    out = capsys.readouterr().out
    assert "PROMPT:\nnums " in out and "REWARD: 1.000 (correct)" in out and '"accuracy": 1.0' in out
    with pytest.raises(ValueError, match="missing action"):
        run_cli("data")


def test_arith_digits_bounded_by_what_python_prints(tmp_path):
    """--digits 10000 used to be a traceback from int(); the bound is Python's int <-> text limit (4300 digits)
    over the operands: 3 x 1433 digits is made (and written), 3 x 1434 is refused."""
    from dllm_rl.errors import UserError

    row = make("arith", 1, 0, operands=3, digits=1433, ops="*")[0]
    assert len(str(row["answer"])) > 4200 and row["expression"].count("*") == 2
    with pytest.raises(UserError, match=r"^arith --digits 1434 with --operands 3: an answer could have 4302 "
                                        r"digits, more than Python converts to text \(4300\); use --digits <= 1433$"):
        make("arith", 1, 0, operands=3, digits=1434)


def test_out_and_test_out_the_same_file_is_refused(tmp_path):
    from dllm_rl.errors import UserError

    out = tmp_path / "x.jsonl"
    out.write_text('{"expression": "1+1", "answer": 2}\n')
    (tmp_path / "sub").mkdir()
    with pytest.raises(UserError, match=r"--out and --test-out are the same file .*: the train rows would replace"):
        run_cli("data", "make", "arith", "--n", "20", "--out", str(out), "--test-out",
                str(tmp_path / "sub" / ".." / "x.jsonl"))
    assert out.read_text() == '{"expression": "1+1", "answer": 2}\n'  # untouched


def test_cli_make_and_show_read_a_yaml_overrides_and_flags(tmp_path, capsys):
    """``data make`` / ``data show`` are on the one front end: a YAML, ``key=value`` and ``--key value`` (the
    documented ``data make TASK --n N ...`` spelling unchanged); another task's knob is refused, not dropped."""
    from dllm_rl.cli import main

    (tmp_path / "make.yaml").write_text("task: countdown\nn: 5\nnumbers: 3\n")
    out = tmp_path / "cd.jsonl"
    assert main(["data", "make", str(tmp_path / "make.yaml"), "seed=1", "--out", str(out), "--max-value", "20"]) == 0
    assert read_rows(out) == make("countdown", 5, 1, numbers=3, max_value=20)
    assert main(["data", "show", f"task={out}", "--task-type", "countdown", "--n", "1"]) == 0
    assert "1 examples shown" in capsys.readouterr().out
    assert main(["data", "make", "countdown", "--n", "5", "--blanks", "3", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("dllm-rl data: error: blanks: a sudoku knob; countdown takes numbers, "
                                               "max_value, max_target")
    assert main(["data", "make", "sudoku", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "dllm-rl data: error: n: required, not given (set n=VALUE)"
