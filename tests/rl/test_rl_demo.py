"""`dllm-rl demo` (what `make demo` runs) on the shipped checkpoints, cut to one short step."""

import json

import pytest

from dllm_rl.cli import main


@pytest.mark.parametrize("model", ["block", "full"])
def test_demo_runs_one_step_and_reports_accuracy_before_and_after(tmp_path, capsys, model):
    rc = main(["demo", "--model", model, "--output-dir", str(tmp_path), "max_steps=1", "eval.limit=8",
               "prompts_per_step=2", "num_generations=4", "progress=false", "log_samples_every=0"])
    assert rc == 0
    out = capsys.readouterr().out
    run = tmp_path / f"{model}-tracerl"  # TraceRL is the default algorithm
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "tracerl" and summary["steps"] == 1
    assert f"held-out greedy accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%}" in out
    assert (run / "final" / "model.safetensors").is_file()
    # the demo's held-out set is the shipped 500-puzzle file, limited here to 8 items
    assert "8 held-out" in out
