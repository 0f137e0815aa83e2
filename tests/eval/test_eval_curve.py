"""`dllm-rl eval --thresholds`: accuracy against forward passes, one point per confidence threshold, each compared
with threshold 1.0 (one token per step)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dllm_rl.cli import main
from dllm_rl.eval.harness import read_records
from dllm_rl.eval.report import accuracy_curve, curve_table
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("evalcurve")
    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    save_model(build_model("llada", cfg, seed=1), d / "llada", tokenizer=tok)
    rows = [(3, 4, 5), (1, 2, 3), (6, 2, 1), (9, 1, 1)]
    (d / "cd.jsonl").write_text("".join(json.dumps({"input": f"{a},{b},{c}", "output": str(a * b - c)}) + "\n"
                                        for a, b, c in rows))
    return d


def _args(d: Path, out: str, *extra: str) -> list[str]:
    return ["eval", str(d / "llada"), "--task", str(d / "cd.jsonl"), "--task-type", "countdown",
            "--prompt-style", "compact", "-o", str(d / out), "--no-run.progress", "--decode.gen-length", "8",
            "--decode.block-length", "8", *extra]


def test_thresholds_give_a_curve_against_one_token_per_step(workdir, capsys):
    rc = main(_args(workdir, "curve", "--thresholds", "0.5,0.9", "--setting", "s1:tokens_per_step=1"))
    assert rc == 0
    out = workdir / "curve"
    summary = json.loads((out / "summary.json").read_text())
    # thr1 (one token per step, the reference) is added; the curve runs from the highest threshold down
    assert list(summary["settings"]) == ["s1", "thr1", "thr0.9", "thr0.5"]
    curve = summary["curve"]
    assert curve["reference"] == "thr1"
    assert [p["threshold"] for p in curve["points"]] == [1.0, 0.9, 0.5]
    ref = curve["points"][0]
    assert ref["accuracy_delta"] == 0 and ref["fewer_passes"] == 1.0
    # threshold 1.0 commits exactly one token per step: the same answers and passes as the static schedule
    one = {r["index"]: (r["completion"], r["nfe"]) for r in read_records(out / "items" / "thr1.jsonl")}
    static = {r["index"]: (r["completion"], r["nfe"]) for r in read_records(out / "items" / "s1.jsonl")}
    assert one == static
    for p in curve["points"]:
        m = summary["settings"][p["setting"]]["metrics"]
        assert p["nfe_mean"] == m["nfe_mean"] and p["tokens_per_nfe"] == m["tokens_per_nfe"]
        assert p["fewer_passes"] == pytest.approx(ref["nfe_mean"] / m["nfe_mean"])
        assert p["accuracy_delta"] == pytest.approx(m["accuracy"] - ref["accuracy"])
        assert summary["settings"][p["setting"]]["decode"]["threshold"] == p["threshold"]
    assert curve["points"][-1]["nfe_mean"] <= ref["nfe_mean"]
    md = (out / "summary.md").read_text()
    assert "## Accuracy vs forward passes" in md and "| 0.9 |" in md and "| 1 | " in md
    assert (out / "accuracy_vs_nfe.png").stat().st_size > 1000
    assert "## Accuracy vs forward passes" in capsys.readouterr().out


def test_curve_numbers_by_hand():
    """Two points: the reference 10 passes at 0.8, threshold 0.9 at 4 passes and 0.75."""
    def metrics(acc, nfe, tpf):
        return {"metrics": {"accuracy": acc, "nfe_mean": nfe, "tokens_per_nfe": tpf}}

    curve = accuracy_curve({"thr1": metrics(0.8, 10.0, 1.0), "thr0.9": metrics(0.75, 4.0, 2.5)},
                           {"thr0.9": 0.9, "thr1": 1.0})
    assert curve["reference"] == "thr1"
    fast = curve["points"][1]
    assert fast["setting"] == "thr0.9" and fast["fewer_passes"] == 2.5
    assert math.isclose(fast["accuracy_delta"], -0.05)
    assert curve_table(curve)[-1] == "| 0.9 | 0.750 | -5.0 pts | 4.0 | 2.50x | 2.50 |"


@pytest.mark.parametrize(("value", "problem"), [
    ("0.5,1.5", "thresholds: 1.5 is outside (0, 1]; a confidence threshold is a probability"),
    ("0.5,x", "thresholds[1]: expected a number, got 'x'"),
])
def test_bad_thresholds_are_one_line(workdir, capsys, value, problem):
    assert main(_args(workdir, "bad", "--thresholds", value)) == 2
    assert capsys.readouterr().err.strip() == f"dllm-rl eval: error: {problem}"
