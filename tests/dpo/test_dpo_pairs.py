"""``dllm-rl pairs``: preference pairs from the shipped demo model's own right and wrong Countdown answers."""

from __future__ import annotations

import json

import pytest

from dllm_rl.cli import main
from dllm_rl.config.renames import DeprecatedKey
from dllm_rl.dpo.pairs import pair_up
from dllm_rl.eval.demo import DEMO_DIR
from dllm_rl.tasks import get_task


def test_pair_up_pairs_distinct_right_and_wrong_answers_in_order():
    texts = ["a", "b", "a", "c", "d", "b", "e"]
    right = [True, False, True, False, True, False, True]
    assert pair_up(texts, right, 1) == [("a", "b")]
    assert pair_up(texts, right, 5) == [("a", "b"), ("d", "c")]  # distinct wrong answers: b, c
    assert pair_up(["x", "x"], [True, True], 3) == []


def _pairs(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["pairs", *args, "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_pairs_of_the_demo_model_are_right_against_wrong_and_reproducible(tmp_path, capsys):
    data = DEMO_DIR / "countdown_train.jsonl"
    rows = _pairs(tmp_path, "a.jsonl", "--model.path", str(DEMO_DIR / "llada-countdown"), "--task", "countdown",
                  "--data", str(data), "--prompt-style", "compact", "--limit", "6", "--k", "6",
                  "--decode.gen-length", "16", "--decode.block-length", "16", "--pairs-per-prompt", "2")
    printed = capsys.readouterr().out
    assert f"pairs: {len(rows)} pairs from 6 prompts x 6 completions" in printed
    task = get_task("countdown", data=str(data), limit=6, prompt_style="compact")
    prompts = {task.build_prompt(ex): ex for ex in task}
    assert len(rows) >= 2 and {r["prompt"] for r in rows} <= set(prompts)
    for r in rows:
        ex = prompts[r["prompt"]]
        good, bad = task.score_examples([r["chosen"], r["rejected"]], [ex, ex])
        assert float(good) == 1.0 and float(bad) < 1.0 and r["chosen"] != r["rejected"]
    assert max(sum(r["prompt"] == p for r in rows) for p in prompts) <= 2
    # the samples' seeds are numbered by prompt and sample: another batch size writes the same file; the same
    # settings from a YAML, a key=value override and the flags of earlier releases (each with its deprecation)
    (tmp_path / "pairs.yaml").write_text(f"model:\n  path: {DEMO_DIR / 'llada-countdown'}\ntask: countdown\n"
                                         f"data: {data}\nprompt_style: compact\ndecode:\n  gen_length: 16\n")
    with pytest.warns(DeprecatedKey) as said:
        again = _pairs(tmp_path, "b.jsonl", str(tmp_path / "pairs.yaml"), "limit=6", "pairs_per_prompt=2",
                       "--batch-size", "5", "--k", "6", "--block-length", "16", "--temperature", "1")
    assert again == rows
    assert sorted(str(w.message).split(" (the old")[0] for w in said) == [
        "config key 'block_length' is deprecated: use 'decode.block_length'",
        "config key 'temperature' is deprecated: use 'decode.temperature'"]
    with pytest.warns(DeprecatedKey) as said:
        assert main(["pairs", "--model", str(DEMO_DIR / "llada-countdown"), "--task", "countdown", "--k", "4",
                     "--temperature", "0", "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "config key 'model' is deprecated: use 'model.path'" in {str(w.message).split(" (the old")[0] for w in said}
    assert capsys.readouterr().err.strip().endswith(
        "dllm-rl pairs: error: decode.temperature: 0 decodes one answer per prompt; sample with a temperature > 0 "
        "(e.g. decode.temperature=1)")
