"""Code task: prompt formats, code extraction, function and stdin/stdout tests, HumanEval and MBPP."""

from __future__ import annotations

import random

import pytest

from dllm_rl.sandbox import SandboxLimits
from dllm_rl.tasks import DataError, get_task
from dllm_rl.tasks.code import mbpp_entry_point

LIMITS = SandboxLimits(timeout_s=5)
# A whole benchmark's reference solutions take ~53 s (MBPP's 974 with the benchmark-data folder) on 2 cores: the
# default suite checks a fixed, seeded sample of them; the whole set runs with -m slow (or -m sweep).
SWEEP = [pytest.mark.slow, pytest.mark.sweep]


def sampled(examples: list, size: int | None) -> list:
    """``size`` of ``examples`` drawn with seed 0, in their order (all of them for ``None`` or a smaller set)."""
    if size is None or size >= len(examples):
        return list(examples)
    keep = sorted(random.Random(0).sample(range(len(examples)), size))
    return [examples[i] for i in keep]
MBPP_ROW = {
    "task_id": 900,
    "text": "Write a function to add one.",
    "code": "def add_one(x):\n    return x + 1",
    "test_list": ["assert add_one(1) == 2", "assert add_one(5) == 6", "assert add_one(-1) == 0"],
    "test_setup_code": "",
    "challenge_test_list": [],
}
STDIO_ROW = {
    "question": "Print the sum of two integers.",
    "inputs": ["1 2\n", "10 -3\n"],
    "outputs": ["3\n", "7\n"],
}
HE_ROW = {
    "task_id": "X/0",
    "prompt": 'def double(x):\n    """Twice x."""\n',
    "entry_point": "double",
    "canonical_solution": "    return 2 * x\n",
    "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n",
}


def task(rows, **kw):
    return get_task("code", data=rows, dataset=None, limits=LIMITS, **kw)


def test_prompt_shows_one_test_example():
    t = task([MBPP_ROW])
    p = t.examples[0]["prompt"]
    assert "Write a function to add one." in p and "assert add_one(1) == 2" in p and "add_one(5)" not in p
    assert "```python" in p
    s = task([STDIO_ROW]).examples[0]["prompt"]
    assert "Example input:\n1 2\n" in s and "Example output:\n3\n" in s
    h = task([HE_ROW]).examples[0]
    assert h["code_prompt"] == HE_ROW["prompt"] and "def double(x):" in h["prompt"]


@pytest.mark.parametrize(
    "completion, reward",
    [
        ("```python\ndef add_one(x):\n    return x + 1\n```", 1.0),
        ("Here:\n```python\nimport math\n```\nand\n```py\ndef add_one(x):\n    return x + 1\n```", 1.0),
        ("def add_one(x):\n    return 2 if x == 1 else 99", 1 / 3),
        ("def add_one(x):\n    return x", 0.0),
        ("no code at all", 0.0),
        ("", 0.0),
    ],
)
def test_mbpp_style_fraction_of_asserts(completion, reward):
    t = task([MBPP_ROW])
    s = t.score_one(completion, t.examples[0])
    assert s == pytest.approx(reward), s.reason
    assert s.info.get("total") == 3


def test_humaneval_body_continuation_or_full_function():
    t = task([HE_ROW])
    ex = t.examples[0]
    assert t.score_one("    return x + x\n", ex) == 1.0
    assert t.score_one("```python\ndef double(x):\n    return x * 2\n```", ex) == 1.0
    assert t.score_one("```python\ndef double(x):\n    return x * 3\n```", ex) == 0.0
    assert t.reference_completion(ex) and t.score_one(t.reference_completion(ex), ex) == 1.0


def test_stdio_tests_compare_output_per_case():
    t = task([STDIO_ROW])
    ex = t.examples[0]
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert t.score_one(good, ex) == 1.0
    assert (
        t.score_one("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nsys.exit(0)", ex)
        == 1.0
    )
    assert t.score_one("a, b = map(int, input().split())\nprint(a + b if a < 5 else 0)", ex) == 0.5
    assert t.score_one("print(3)", ex) == 0.5
    s = t.score_one("import os\nos.write(1, b'3\\n')\nos._exit(0)", ex)
    assert s == 0.5, s.reason  # raw fd writes are captured too; the second case prints the wrong sum
    assert t.score_one("raise SystemExit(1)", ex) == 0.0


def test_other_stdio_formats_and_missing_tests_error():
    apps = {"problem": "Echo.", "input_output": '{"inputs": ["hi\\n"], "outputs": ["hi\\n"]}'}
    pairs = {"question": "Echo.", "tests": [{"input": "hi\n", "output": "hi"}]}
    for row in (apps, pairs):
        t = task([row])
        assert t.score_one("print(input())", t.examples[0]) == 1.0
    with pytest.raises(DataError, match=r"rows\[0\]: missing tests for the code task"):
        task([{"question": "no tests"}]).load()


def test_reward_from_trl_columns():
    t = task([MBPP_ROW, STDIO_ROW])
    cols = {
        k: [ex.get(k) for ex in t.examples]
        for k in ("tests", "test_mode", "setup", "entry_point", "code_prompt")
    }
    out = t.reward_fn(None, ["def add_one(x): return x + 1", "print(sum(map(int, input().split())))"], **cols)
    assert out == [1.0, 1.0]


#: correct programs the sandbox once scored 0 (a global the test reads after calling, a deque / array / date result or
#: argument, a process pool), as MBPP rows: (code, test, setup)
WIDER = {
    "global": ("calls = 0\ndef tick():\n    global calls\n    calls += 1\n",
               "assert tick() is None and tick() is None and calls == 2", ""),
    "deque": ("from collections import deque\ndef rotate(xs, k):\n    d = deque(xs)\n    d.rotate(k)\n    return d\n",
              "assert rotate([1, 2, 3], 1) == deque([3, 1, 2])", "from collections import deque"),
    "array": ("import array\ndef as_array(xs):\n    return array.array('i', xs)\n",
              "assert as_array([1, 2]) == array.array('i', [1, 2])", "import array"),
    "date": ("import datetime\ndef next_day(d):\n    return d + datetime.timedelta(days=1)\n",
             "assert next_day(datetime.date(2024, 2, 28)) == datetime.date(2024, 2, 29)", "import datetime"),
    "pool": ("from multiprocessing import Pool\ndef _sq(x):\n    return x * x\n"
             "def squares(xs):\n    with Pool(2) as p:\n        return p.map(_sq, xs)\n",
             "assert squares([1, 2, 3]) == [1, 4, 9]", ""),
}


@pytest.mark.parametrize("case", list(WIDER))
def test_correct_programs_with_live_globals_stdlib_values_or_a_pool_score_one(case):
    code, test, setup = WIDER[case]
    t = task([{**MBPP_ROW, "code": code, "test_list": [test], "test_setup_code": setup}])
    s = t.score_one(f"```python\n{code}```", t.examples[0])
    assert s == 1.0, s.reason
    if case == "global":
        assert t.score_one("calls = 0\ndef tick():\n    pass\n", t.examples[0]) == 0.0


def test_mbpp_entry_point():
    assert mbpp_entry_point("assert math.isclose(area(2), 4.0)") == "area"
    assert mbpp_entry_point("assert set(similar((3, 4), (5, 4))) == set((4,))") == "similar"


@pytest.mark.parametrize("sample", [40, pytest.param(None, id="all", marks=SWEEP)])
def test_humaneval_canonical_solutions_pass(sample):
    t = get_task("humaneval", limits=SandboxLimits(timeout_s=20))  # the complete set, bundled
    assert t.source.endswith("assets/data/humaneval/HumanEval.jsonl.gz")
    assert len(t.examples) == 164
    examples = sampled(t.examples, sample)
    scores = t.score_examples([ex["canonical_solution"] for ex in examples], examples)
    failed = [(ex["task_id"], s.reason) for ex, s in zip(examples, scores) if s != 1.0]
    assert not failed, failed[:5]
    wrong = t.score_examples(["    return None\n"] * 20, examples[:20])
    assert all(s == 0.0 for s in wrong)


def test_mbpp_533_reference_passes_a_builtin_type_to_the_program():
    row = {
        "task_id": 533,
        "text": "Write a function to remove particular data type elements from the given tuple.",
        "code": "def remove_datatype(tup, data_type):\n  return [e for e in tup if not isinstance(e, data_type)]",
        "test_list": [
            "assert remove_datatype((4, 5, 4, 7.7, 1.2), int) == [7.7, 1.2]",
            "assert remove_datatype((7, 8, 9, 'SR'), str) == [7, 8, 9]",
        ],
    }
    t = task([row])
    s = t.score_one(t.reference_completion(t.examples[0]), t.examples[0])
    assert s == 1.0, s.reason


def test_mbpp_126_entry_point_is_the_builtin_name_the_reference_defines():
    code = (
        "def sum(a,b): \n    sum = 0\n    for i in range (1,min(a,b)): \n"
        "        if (a % i == 0 and b % i == 0): \n            sum += i \n    return sum"
    )  # MBPP 126's reference
    assert mbpp_entry_point("assert sum(10,15) == 6", code) == "sum" and mbpp_entry_point("assert sum(1) == 1") is None
    row = {"task_id": 126, "text": "Sum of common divisors.", "code": code}
    row["test_list"] = ["assert sum(10,15) == 6", "assert sum(100,150) == 93", "assert sum(4,6) == 3"]
    t = task([row])
    ex = t.examples[0]
    assert ex["entry_point"] == "sum"
    assert t.score_one(t.reference_completion(ex), ex) == 1.0
    assert t.score_one("def sum(a, b):\n    return 6", ex) == pytest.approx(1 / 3)


@pytest.mark.parametrize("sample", [100, pytest.param(None, id="all", marks=SWEEP)])
def test_mbpp_reference_solutions_pass(mbpp_test, sample):
    path, rows = mbpp_test  # every split (974) with the benchmark-data folder, else the bundled 50
    t = get_task("mbpp", data=path, split="all", limits=SandboxLimits(timeout_s=20))
    assert len(t.examples) == (974 if rows == 500 else rows) and t.examples[0]["task_id"] == (1 if rows == 500 else 11)
    examples = sampled(t.examples, sample)
    scores = t.score_examples([t.reference_completion(ex) for ex in examples], examples)
    failed = [(ex["task_id"], s.reason) for ex, s in zip(examples, scores) if s != 1.0]
    assert not failed, failed[:5]
    wrong = t.score_examples(["```python\ndef f(*a):\n    return None\n```"] * 20, examples[:20])
    assert all(s == 0.0 for s in wrong)
