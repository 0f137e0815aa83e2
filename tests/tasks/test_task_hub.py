"""Task data by hub id: a dataset repository snapshot in a hub cache the test builds, read offline through
`datasets`; the default data of each named task when no benchmark-data folder exists."""

from __future__ import annotations

import json

import pytest
from hub_fixture import populate_hub_cache

from dllm_rl.errors import UserError
from dllm_rl.tasks import get_task

CARD = "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: test\n    path: main/test-*\n---\n"
ROWS = [{"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "Half of 1,000?", "answer": "#### 500"}]


@pytest.fixture
def no_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_RL_DATA", str(tmp_path / "absent"))


def _cache_gsm8k(cache):
    body = "".join(json.dumps(r) + "\n" for r in ROWS)
    populate_hub_cache(cache, "openai/gsm8k", {"README.md": CARD, "main/test-00000-of-00001.jsonl": body},
                       repo_type="dataset")


def test_a_dataset_by_hub_id_loads_from_the_cache_offline(offline_hub):
    _cache_gsm8k(offline_hub)
    task = get_task("hf:openai/gsm8k:main@test", task_type="gsm8k")
    assert [ex["final_answer"] for ex in task.examples] == ["7", "500"]
    assert task.examples[0]["question"] == ROWS[0]["question"]
    assert task.score_one("#### 7", task.examples[0]) == 1.0


def test_named_task_without_a_data_folder_reads_its_hub_dataset(offline_hub, no_data_folder):
    _cache_gsm8k(offline_hub)
    task = get_task("gsm8k", split="test")
    assert task.source == "hf:openai/gsm8k:main@test"
    assert [ex["final_answer"] for ex in task.examples] == ["7", "500"]


def test_absent_hub_dataset_names_the_id_and_the_cache(offline_hub):
    with pytest.raises(UserError) as err:
        get_task("hf:org/absent@test", task_type="gsm8k").load()
    assert str(err.value) == (
        f"dataset 'org/absent' is not a local directory and not in the hub cache {offline_hub} (HF_HUB_OFFLINE is "
        "set): download it first (`hf download org/absent --repo-type dataset` with network) or unset HF_HUB_OFFLINE")


def test_default_data_of_each_named_task_without_a_data_folder(no_data_folder):
    def source(name, **kw):
        return str(get_task(name, **kw).default_data())

    assert source("gsm8k", split="train") == "hf:openai/gsm8k:main@train"
    assert source("math") == "hf:HuggingFaceH4/MATH-500@test"
    assert source("mbpp", split="test") == "hf:google-research-datasets/mbpp:full@test"
    assert source("countdown", split="train") == "hf:Jiayi-Pan/Countdown-Tasks-3to4@train"
    for name, file in (("countdown", "countdown/cd3_test.jsonl"), ("sudoku", "sudoku/4x4_test.csv"),
                       ("humaneval", "humaneval/HumanEval.jsonl.gz")):  # complete sets, bundled
        assert source(name).endswith(f"dllm_rl/assets/data/{file}")
    with pytest.raises(FileNotFoundError, match=r"^task 'sudoku' has no default 'train' data \(has: test\)"):
        get_task("sudoku", split="train").default_data()
