"""Rewards never raise on model output: junk scores 0 with a reason, for every built-in task; a custom reward
cannot end the run."""

from __future__ import annotations

import math
import sys
import time

import pytest
from PIL import Image

from dllm_rl.sandbox import SandboxLimits
from dllm_rl.tasks import Score, get_task
from dllm_rl.tasks.base import RewardError

ROWS = {
    "gsm8k": [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}],
    "math": [{"problem": "Compute 1/2.", "answer": "\\frac{1}{2}"}],
    "countdown": [{"input": "3,5,7", "output": "22"}],
    "sudoku": [{"Puzzle": "3102200002100320", "Solution": "3142243142131324"}],
    "arith": [{"expression": "12+3*4", "answer": "24"}],
    "code": [{"text": "Add one.", "test_list": ["assert f(1) == 2", "assert f(2) == 3"]}],
    "shapes": [{"image": Image.new("RGB", (32, 32)), "kind": "count", "query": "count red circle", "answer": "1",
                "question": "How many red circles are in the image?"}],
    "image_choice": [{"image": Image.new("RGB", (32, 32)), "question": "Colour?", "options": ["red", "blue"],
                      "answer": "A"}],
}

JUNK = {
    "empty": "",
    "binary": bytes(range(256)) * 8,
    "surrogates": "\ud800\udfff\x00\x1b[31m",
    "1MB": "lorem ipsum " * 90_000,
    "unbalanced boxed": "so the answer is \\boxed{\\frac{1}{2}",
    "many open boxes": "\\boxed{" * 100_000,
    "many open tags": "<answer>(" * 100_000,
    "deep parens": "<answer>" + "(" * 50_000 + "1" + ")" * 50_000 + "</answer>",
}


@pytest.fixture(scope="module")
def tasks():
    out = {name: get_task(name, data=rows) for name, rows in ROWS.items() if name != "code"}
    out["code"] = get_task("code", data=ROWS["code"], dataset=None, limits=SandboxLimits(timeout_s=3))
    return out


@pytest.mark.parametrize("task_name", sorted(ROWS))
def test_junk_scores_zero_with_reason(tasks, task_name):
    task = tasks[task_name]
    ex = task.examples
    start = time.monotonic()
    scores = task.score_examples(list(JUNK.values()), ex * len(JUNK))
    elapsed = time.monotonic() - start
    for name, s in zip(JUNK, scores):
        assert isinstance(s, Score), name
        assert s == 0.0, (name, s)
        assert s.reason, name
    assert elapsed < 20, f"junk scoring took {elapsed:.1f}s"


def test_specific_reasons(tasks):
    gsm, math, cd = tasks["gsm8k"], tasks["math"], tasks["countdown"]
    assert "unbalanced" in gsm.score_one("\\boxed{4", gsm.examples[0]).reason
    assert "unbalanced" in math.score_one("\\boxed{\\frac{1}{2}", math.examples[0]).reason
    assert math.score_one("", math.examples[0]).reason == "no \\boxed{} answer"
    assert cd.score_one("3*5+7", cd.examples[0]).reason == "no <answer>...</answer>"


def test_reference_completions_score_one(tasks):
    for name, task in tasks.items():
        if name == "code":
            continue
        (ex,) = task.examples
        ref = task.reference_completion(ex)
        assert ref is not None, name
        assert task.score_one(ref, ex) == 1.0, (name, ref, task.score_one(ref, ex))


def _exits(prompts, completions, **columns):
    sys.exit(0)


def _interrupted(prompts, completions, **columns):
    raise KeyboardInterrupt


def _partial(prompts, completions, **columns):
    return [None, 0.5, [0.25, None]][: len(completions)]


def test_a_custom_reward_cannot_end_the_run_but_ctrl_c_still_does():
    """sys.exit(0) inside a reward used to end the whole run with exit status 0; it is a RewardError (a user
    error: one line) naming the reward. Ctrl-C stays the user's: KeyboardInterrupt passes through unchanged."""
    rows = ROWS["countdown"] * 3
    task = get_task("countdown", data=rows, reward_fn=_exits)
    with pytest.raises(RewardError, match=r"^reward 'test_task_rewards_robust:_exits' raised SystemExit\(0\): a reward "
                       r"must return one score per completion and may not end the run; fix the reward$"):
        task.score_examples(["x"], task.examples[:1])
    with pytest.raises(KeyboardInterrupt):
        get_task("countdown", data=rows, reward_fn=_interrupted).score_examples(["x"], task.examples[:1])
    # None is no score: NaN with a reason (the RL trainer counts it and scores it 0), in a per-step list too
    partial = get_task("countdown", data=rows, reward_fn=_partial)
    scores = partial.score_examples(["a", "b", "c"], partial.examples)
    assert math.isnan(scores[0]) and scores[0].reason == "_partial returned None" and scores[1] == 0.5
    assert math.isnan(scores[2]) and math.isnan(scores[2].info["steps"][1])
    assert partial.reward_name == "test_task_rewards_robust:_partial"
    assert get_task("countdown", data=rows).reward_name == "countdown_reward"
