"""benchmarks/learning.py: its table (``--report``, no run started) gives the held-out passes per answer before and
after training and the tokens per forward after, from the runs' summaries."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _learning():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # learning.py imports its neighbour rare_shapes.py
    try:
        spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "benchmarks" / "learning.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


def test_report_rows_give_passes_and_tokens_per_forward(tmp_path, monkeypatch, capsys):
    learning = _learning()
    for seed, (after, nfe, tpf) in enumerate([(0.3, 6.0, 3.0), (0.4, 4.0, 3.4)]):
        run = tmp_path / f"full-espo-seed{seed}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({
            "accuracy_before": 0.25, "accuracy_after": after, "steps": 10, "minutes": 2.0,
            "nfe_before": 16.0, "nfe_after": nfe, "tpf_before": 1.0, "tpf_after": tpf}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "time_rollout": 1.0, "time_update": 0.5}) + "\n")
    monkeypatch.setattr(sys, "argv", ["learning.py", "--runs", "full:espo", "--seeds", "0", "1", "--report",
                                      "--out", str(tmp_path)])
    learning.main()
    table = (tmp_path / "table.md").read_text().splitlines()
    assert "passes per answer: before -> after (tokens per forward)" in table[0]
    assert "| 16.0 -> 5.0 (3.20) |" in table[2]
    assert "| 16.0 -> 5.0 (3.20) |" in capsys.readouterr().out
