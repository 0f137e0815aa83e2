"""The held-out evaluation of an RL run reports its forward passes per answer and tokens per forward."""

import json

import pytest
from rl_helpers import digit_reward, rl_overrides

from dllm_rl.config import load_config
from dllm_rl.rl.config import RLConfig
from dllm_rl.rl.loop import train


def test_heldout_reports_passes_and_tokens_per_forward(rl_setup, tmp_path):
    """Evaluation decodes one token per step (8 passes for 8 slots); the
    summary, the metrics rows (before, during and after) and the returned numbers agree."""
    out = tmp_path / "run"
    summary = train(load_config(RLConfig, None, rl_overrides(
        rl_setup, "llada", out, "algorithm=espo", "train.max_steps=2", "eval.limit=4", "eval.every=1",
        "drop_zero_variance=false")), reward_fn=digit_reward)
    assert summary["nfe_before"] == summary["nfe_after"] == 8.0  # one token per step, 8 slots, no early EOS here
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_nfe" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["eval_tpf"] == pytest.approx(r["eval_nfe"] and 8 / r["eval_nfe"])  # 8 answer tokens per 8 passes
    assert summary["tpf_before"] == summary["tpf_after"] == pytest.approx(evals[0]["eval_tpf"])
    assert json.loads((out / "summary.json").read_text())["tpf_after"] == summary["tpf_after"]
