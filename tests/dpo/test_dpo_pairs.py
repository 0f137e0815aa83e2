"""``dllm-rl pairs``: preference pairs from the shipped demo model's own right and wrong Countdown answers."""

from __future__ import annotations

import json

from dllm_rl.cli import main
from dllm_rl.dpo.pairs import pair_up
from dllm_rl.eval.demo import DEMO_DIR
from dllm_rl.tasks import get_task


def test_pair_up_pairs_distinct_right_and_wrong_answers_in_order():
    texts = ["a", "b", "a", "c", "d", "b", "e"]
    right = [True, False, True, False, True, False, True]
    assert pair_up(texts, right, 1) == [("a", "b")]
    assert pair_up(texts, right, 5) == [("a", "b"), ("d", "c")]  # distinct wrong answers: b, c
    assert pair_up(["x", "x"], [True, True], 3) == []


def _pairs(tmp_path, name, *extra):
    out = tmp_path / name
    data = DEMO_DIR / "countdown_train.jsonl"
    args = ["pairs", "--model", str(DEMO_DIR / "llada-countdown"), "--task", "countdown", "--data", str(data),
            "--prompt-style", "compact", "--limit", "6", "--k", "6", "--temperature", "1", "--gen-length", "16",
            "--block-length", "16", "--out", str(out), *extra]
    assert main(args) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_pairs_of_the_demo_model_are_right_against_wrong_and_reproducible(tmp_path, capsys):
    rows = _pairs(tmp_path, "a.jsonl", "--pairs-per-prompt", "2")
    printed = capsys.readouterr().out
    assert f"pairs: {len(rows)} pairs from 6 prompts x 6 completions" in printed
    task = get_task("countdown", data=str(DEMO_DIR / "countdown_train.jsonl"), limit=6, prompt_style="compact")
    prompts = {task.build_prompt(ex): ex for ex in task}
    assert len(rows) >= 2 and {r["prompt"] for r in rows} <= set(prompts)
    for r in rows:
        ex = prompts[r["prompt"]]
        good, bad = task.score_examples([r["chosen"], r["rejected"]], [ex, ex])
        assert float(good) == 1.0 and float(bad) < 1.0 and r["chosen"] != r["rejected"]
    assert max(sum(r["prompt"] == p for r in rows) for p in prompts) <= 2
    # the samples' seeds are numbered by prompt and sample: another batch size writes the same file
    assert _pairs(tmp_path, "b.jsonl", "--pairs-per-prompt", "2", "--batch-size", "5") == rows
    assert main(["pairs", "--model", str(DEMO_DIR / "llada-countdown"), "--task", "countdown", "--k", "4",
                 "--temperature", "0", "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "--temperature 0 decodes one answer per prompt" in capsys.readouterr().err
