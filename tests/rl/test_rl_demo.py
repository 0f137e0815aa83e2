"""`dllm-rl demo` (what `make demo` runs) on the shipped checkpoints, cut to one short step."""

import json

import pytest

from dllm_rl.cli import main


@pytest.mark.parametrize("model", ["block", "full", "vision"])
def test_demo_runs_one_step_and_reports_accuracy_before_and_after(tmp_path, capsys, model):
    ema = ["train.ema_decay=0.9"] if model == "full" else []  # the weight average's line of the report
    rc = main(["demo", "--model", model, "--output-dir", str(tmp_path), "train.max_steps=1", "eval.limit=8",
               "train.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false", "log.samples_every=0",
               *ema])
    assert rc == 0
    out = capsys.readouterr().out
    default = {"block": "espo", "full": "tracerl", "vision": "tracerl"}[model]  # the demo configs' algorithms
    run = tmp_path / f"{model}-{default}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == default and summary["steps"] == 1
    report = f"held-out greedy accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%}"
    if ema:
        report += f" (weight average; last live policy {summary['accuracy_after_live']:.1%})"
    assert report + " in " in out
    assert (run / "final" / "model.safetensors").is_file()
    # the demo's held-out set is the shipped file (500 puzzles, 300 shapes questions), limited here to 8 items
    assert "8 held-out" in out
    name = {"block": "block-attention model", "full": "full-attention model", "vision": "LLaDA-V-shaped vision model"}
    assert f"demo ({default} on the {name[model]}): " in out
    if model == "block":  # run again into the same folder (`make demo` twice): the old run is replaced
        (run / "checkpoints" / "step-0000001").rename(run / "checkpoints" / "step-0000007")
        assert main(["demo", "--model", model, "--output-dir", str(tmp_path), "train.max_steps=1", "eval.limit=8",
                     "train.prompts_per_step=2", "rollout.num_generations=4", "run.progress=false",
                     "log.samples_every=0"]) == 0
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-0000001"]
        assert json.loads((run / "summary.json").read_text())["start_step"] == 0
