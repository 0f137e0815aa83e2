"""`dllm-rl eval --decoding learned`: each item decoded at the threshold the checkpoint's threshold head gives its
prompt, exactly as `dllm-rl generate --decoding learned` decodes it; a per-setting `decoding=learned`; the refusals."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from dllm_rl.cli import main
from dllm_rl.config import ConfigError
from dllm_rl.eval.harness import read_records
from dllm_rl.eval.settings import parse_setting, resolve_decode, threshold_settings
from dllm_rl.models import build_model, char_tokenizer, load_model, save_model, tiny_config
from dllm_rl.sampling.threshold_head import ThresholdHead, prompt_features
from dllm_rl.tasks import get_task

T_MIN, T_MAX = 0.5, 0.95


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A tiny LLaDA made confident (its output layer scaled up: committed tokens' probabilities near 0.4-0.7, so
    a threshold of 0.5 commits several tokens a step and 0.95 one), and copies with hand-set heads."""
    d = tmp_path_factory.mktemp("evallearned")
    tok = char_tokenizer()
    cfg = tiny_config("llada", vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = build_model("llada", cfg, seed=1)
    with torch.no_grad():
        model.causal_lm.lm_head.weight.mul_(30)
    save_model(model, d / "llada", tokenizer=tok)
    rows = [(3, 4, 5), (1, 2, 3), (6, 2, 1), (9, 1, 1)]
    (d / "cd.jsonl").write_text("".join(json.dumps({"input": f"{a},{b},{c}", "output": str(a * b - c)}) + "\n"
                                        for a, b, c in rows))
    task = get_task(str(d / "cd.jsonl"), task_type="countdown", prompt_style="compact")
    texts = [task.build_prompt(ex, tok) for ex in task.load()]
    feats = prompt_features(load_model(d / "llada", device="cpu"), [tok.encode(t) for t in texts])
    w = torch.randn(32, generator=torch.Generator().manual_seed(0))
    # fast: threshold ~0.5; slow: ~0.95; mixed: each prompt its own, mu = 4 w.(h - mean h) spread about 0
    for name, weight, bias in (("fast", 0 * w, -10.0), ("slow", 0 * w, 10.0),
                               ("mixed", 4 * w, -4 * float(w @ feats.mean(0)))):
        shutil.copytree(d / "llada", d / name)
        head = ThresholdHead(32, T_MIN, T_MAX, 0.5)
        with torch.no_grad():
            head.linear.bias.fill_(bias)
            head.linear.weight.copy_(weight[None])
        head.save(d / name)
    return d


DECODE = ["--decode.gen-length", "8", "--decode.block-length", "8"]


def _eval(d: Path, model: str, out: str, *extra: str) -> int:
    return main(["eval", str(d / model), "--task", str(d / "cd.jsonl"), "--task-type", "countdown",
                 "--prompt-style", "compact", "-o", str(d / out), "--no-run.progress", *DECODE, *extra])


def _generate_nfe(d: Path, model: str, prompts: list[str], capsys) -> list[int]:
    """`dllm-rl generate --decoding learned`'s forward passes per prompt."""
    capsys.readouterr()
    argv = ["generate", str(d / model), "--decoding", "learned", *DECODE]
    for p in prompts:
        argv += ["--prompt", p]
    assert main(argv) == 0
    return [int(n) for n in re.findall(r"^=== \[\d+\] \S+, (\d+) NFE$", capsys.readouterr().out, re.M)]


def _records(d: Path, out: str, setting: str) -> list[dict]:
    return sorted(read_records(d / out / "items" / f"{setting}.jsonl"), key=lambda r: r["index"])


def test_eval_learned_decodes_each_item_as_generate_does(workdir, capsys):
    nfes = {}
    for name, tau in (("fast", T_MIN + (T_MAX - T_MIN) / (1 + math.exp(10))),
                      ("slow", T_MIN + (T_MAX - T_MIN) / (1 + math.exp(-10)))):
        assert _eval(workdir, name, name, "--decoding", "learned") == 0
        recs = _records(workdir, name, "default")
        assert [r["threshold"] for r in recs] == pytest.approx([tau] * 4)  # the head's mean: no draw
        nfes[name] = [r["nfe"] for r in recs]
        assert nfes[name] == _generate_nfe(workdir, name, [r["prompt"] for r in recs], capsys)
        summary = json.loads((workdir / name / "summary.json").read_text())
        s = summary["settings"]["default"]
        assert s["decode"]["decoding"] == "learned" and s["metrics"]["threshold_mean"] == pytest.approx(tau)
        assert s["metrics"]["nfe_mean"] == sum(nfes[name]) / 4
        assert summary["meta"]["threshold_head"] == {"t_min": T_MIN, "t_max": T_MAX, "sigma": 0.5}
        assert f"decoding=learned (mean threshold {tau:.3f})" in (workdir / name / "summary.md").read_text()
    # threshold 0.95 commits one token a step (8 passes for 8 tokens); 0.5 commits several
    assert nfes["slow"] == [8] * 4 and sum(nfes["fast"]) < sum(nfes["slow"])


def test_a_setting_decodes_learned_with_each_prompts_threshold(workdir, capsys):
    assert _eval(workdir, "mixed", "mixed", "--setting", "one:tokens_per_step=1", "--setting",
                 "mine:decoding=learned", "--thresholds", "0.5", "--trace-items", "1") == 0
    summary = json.loads((workdir / "mixed" / "summary.json").read_text())
    assert list(summary["settings"]) == ["one", "mine", "thr1", "thr0.5"]
    assert [n for n, s in summary["settings"].items() if s["decode"].get("decoding")] == ["mine"]
    recs = _records(workdir, "mixed", "mine")
    taus = [r["threshold"] for r in recs]
    assert len({round(t, 6) for t in taus}) == 4 and all(T_MIN < t < T_MAX for t in taus)
    nfe = [r["nfe"] for r in recs]
    assert nfe == _generate_nfe(workdir, "mixed", [r["prompt"] for r in recs], capsys)
    assert len(set(nfe)) > 1  # the prompts' own thresholds decode them at different speeds
    assert all("threshold" not in r for r in _records(workdir, "mixed", "one"))
    assert (workdir / "mixed" / "traces" / "mine.html").stat().st_size > 1000  # traced at the item's threshold


def test_learned_base_keeps_the_curve_at_fixed_thresholds():
    base = {"gen_length": 8, "decoding": "learned"}
    curve = threshold_settings([0.9], base)
    assert [s.overrides for s in curve] == [{"threshold": 1.0, "decoding": "config"},
                                            {"threshold": 0.9, "decoding": "config"}]
    assert [resolve_decode(base, s).decoding for s in curve] == ["config", "config"]
    assert threshold_settings([0.9], {"gen_length": 8})[1].overrides == {"threshold": 0.9}  # as recorded before


@pytest.mark.parametrize(("spec", "block_size", "message"), [
    ("x:decoding=learned,threshold=0.9", None, "setting 'x': decoding=learned chooses each prompt's threshold: "
     "drop threshold"),
    ("x:decoding=learned,tokens_per_step=2", None, "drop tokens_per_step"),
    ("x:decoding=learned,steps=4,remasking=rcr", None, "drop steps"),
    ("x:decoding=learned,remasking=rcr", None, "rcr re-masks on the static one"),
    ("x:decoding=learned,block_cache=false", 4, "drop block_cache=false"),
    ("x:decoding=fast", None, "setting 'x': decoding: expected one of config, learned, got 'fast'"),
])
def test_learned_setting_conflicts_are_refused(spec, block_size, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_decode({"gen_length": 8}, parse_setting(spec), block_size)


def test_a_checkpoint_without_a_head_is_one_line_naming_the_key(workdir, capsys):
    assert _eval(workdir, "llada", "nohead", "--decoding", "learned") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no learned threshold head (threshold_head.safetensors); decoding=learned needs a checkpoint" in err
    assert _eval(workdir, "llada", "nohead2", "--setting", "l:decoding=learned") == 2
    assert "setting 'l': decoding=learned needs a checkpoint" in capsys.readouterr().err
    assert not (workdir / "nohead2" / "items").exists()  # refused before loading or decoding anything
