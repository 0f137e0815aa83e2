"""`dllm-rl eval | trace | plot` from the command line, including a real SIGKILL halfway through an eval."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dllm_rl.sampling as sampling
from dllm_rl.eval.cli import register
from dllm_rl.eval.harness import read_records
from dllm_rl.models import build_model, char_tokenizer, save_model, tiny_config

RUNNER = ("import argparse, sys\n"
          "from dllm_rl.eval.cli import register\n"
          "p = argparse.ArgumentParser(prog='dllm-rl'); sub = p.add_subparsers(dest='command'); register(sub)\n"
          "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n")


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dllm-rl")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    register(sub)  # idempotent: listing the module under several names in cli.SUBCOMMANDS is harmless
    args = parser.parse_args(argv)
    args.argv = list(argv)  # as dllm_rl.cli.main records it
    return args.func(args)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("evalcli")
    tok = char_tokenizer()
    for fam in ("llada", "sdar"):
        cfg = tiny_config(fam, vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                          intermediate_size=64, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        save_model(build_model(fam, cfg, seed=1), d / fam, tokenizer=tok)
    rows = [(3, 4, 5), (1, 2, 3), (6, 2, 1), (9, 1, 1), (2, 2, 2), (8, 3, 1)]
    (d / "cd.jsonl").write_text("".join(json.dumps({"input": f"{a},{b},{c}", "output": str(a * b - c)}) + "\n"
                                        for a, b, c in rows))
    return d


def _eval_args(d: Path, out: str, *extra: str) -> list[str]:
    return ["eval", str(d / "llada"), "--task", str(d / "cd.jsonl"), "--task-type", "countdown",
            "--prompt-style", "compact", "-o", str(d / out), "--no-run.progress", *extra]


def test_eval_cli_writes_all_reports(workdir, capsys):
    rc = _main(_eval_args(workdir, "cli", "--decode.gen-length", "8", "--decode.block-length", "4", "--limit", "4",
                          "--setting", "s1:tokens_per_step=1", "--setting", "s2:tokens_per_step=2",
                          "--setting", "dyn:threshold=0.9", "--trace-items", "2"))
    assert rc == 0
    out = workdir / "cli"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["settings"]) == ["s1", "s2", "dyn"]
    assert summary["settings"]["s1"]["metrics"]["nfe_mean"] == 8
    assert summary["settings"]["s2"]["metrics"]["nfe_mean"] == 4
    assert summary["items"] == 4 and summary["command"].startswith("dllm-rl eval ")
    for name in ("s1", "s2", "dyn"):
        assert len(read_records(out / "items" / f"{name}.jsonl")) == 4
        page = (out / "traces" / f"{name}.html").read_text()
        assert page.count('"label": "item ') == 2
    printed = capsys.readouterr().out
    assert "| s1 |" in printed and "| dyn |" in printed  # the Markdown table is printed
    assert (out / "accuracy_vs_nfe.png").stat().st_size > 1000


def test_cli_unknown_setting_key_is_one_clear_error(workdir):
    with pytest.raises(ValueError, match="unknown key 'gen_lenght'.*did you mean 'gen_length'.*tokens_per_step"):
        _main(_eval_args(workdir, "bad", "--setting", "x:gen_lenght=8"))
    with pytest.raises(ValueError, match="max_tokens=1"):
        _main(_eval_args(workdir, "bad", "--task-options", "max_tokens=1"))


def test_trace_cli_from_model_and_from_generate_trace(workdir, capsys):
    html = workdir / "t.html"
    assert _main(["trace", str(workdir / "sdar"), "--prompt", "nums 3 4 5 target 7\n", "--prompt", "nums 1 2",
                  "--decode.gen-length", "8", "--decode.steps", "2", "-o", str(html)]) == 0
    page = html.read_text()
    data = json.loads(page.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    recs = data["records"]
    assert [r["label"] for r in recs] == ["prompt 0", "prompt 1"]
    assert "".join(recs[1]["prompt_tokens"]) == "nums 1 2"
    for r in recs:  # steps 0..nfe-1, 2 tokens per step inside each block of 4
        steps = [s for s in r["step_map"] if s >= 0]
        assert max(steps) + 1 == r["nfe"] == r["num_steps"]
        assert all(steps.count(k) <= 2 for k in set(steps))
        assert r["block_length"] == 4 and r["block_offset"] == len(r["prompt_tokens"])

    # The sampling engineer's `dllm-rl generate --trace` format (tokens, steps, confidence per generated token).
    from dllm_rl.models import load_model, load_tokenizer
    from dllm_rl.sampling import DecodeConfig, generate
    from dllm_rl.sampling.cli import trace_records

    tok = load_tokenizer(workdir / "llada")
    model = load_model(workdir / "llada")
    cfg = DecodeConfig(gen_length=8, block_length=4)
    roll = generate(model, [tok.encode("nums 1 2 3")], cfg, tokenizer=tok)
    jsonl = workdir / "gen_trace.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in trace_records(roll, ["nums 1 2 3"], cfg, tok, 4)))
    assert _main(["trace", "--from-trace", str(jsonl), "-o", str(workdir / "g.html")]) == 0
    data = json.loads((workdir / "g.html").read_text().split('type="application/json">', 1)[1].split("</script>")[0])
    rec = data["records"][0]
    assert rec["step_map"] == [s for s in roll.step_map[0].tolist() if s >= 0]
    assert "".join(rec["tokens"][: rec["answer_length"]]).startswith(roll.texts[0])
    with pytest.raises(ValueError, match="--prompt TEXT"):
        _main(["trace", str(workdir / "llada"), "-o", str(workdir / "x.html")])


def test_plot_cli(workdir, capsys):
    run = workdir / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 10, "kl": 0.01 * s}) + "\n"
                                               for s in range(5)))
    assert _main(["plot", str(run)]) == 0
    assert (run / "dashboard.png").read_bytes()[:4] == b"\x89PNG" and not (run / "plots").exists()
    assert _main(["plot", str(run), "--per-metric"]) == 0
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["kl.png", "reward.png"]
    with pytest.raises(ValueError, match="several runs are drawn on one page: say where with -o FILE.png"):
        _main(["plot", str(run), str(run)])
    assert _main(["plot", str(run), str(run), "-o", str(workdir / "both.png")]) == 0
    assert (workdir / "both.png").is_file()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        _main(["plot", str(workdir / "nope")])


@pytest.mark.slow
def test_eval_killed_halfway_then_rerun_gives_same_numbers(workdir, monkeypatch):
    opts = ["--decode.gen-length", "16", "--decode.block-length", "8", "--num-samples", "4", "--decode.temperature",
            "0.9"]
    argv = _eval_args(workdir, "killed", *opts, "--batch-size", "1")
    items = workdir / "killed" / "items" / "default.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, *argv], stdin=subprocess.DEVNULL, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if items.is_file() and items.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"eval finished or died before it could be killed: {proc.stderr.read()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = len(read_records(items))
    assert 5 <= done < 24

    real = sampling.generate
    decoded: list[int] = []
    monkeypatch.setattr(sampling, "generate", lambda *a, **k: (decoded.append(len(a[1])), real(*a, **k))[1])
    # Resume with another batch size: results do not depend on batching (per-sample seeds).
    assert _main(_eval_args(workdir, "killed", *opts, "--batch-size", "8")) == 0
    assert sum(decoded) == 24 - done  # finished samples were not recomputed
    decoded.clear()
    assert _main(_eval_args(workdir, "unkilled", *opts, "--batch-size", "24")) == 0
    assert sum(decoded) == 24

    def numbers(out):
        s = json.loads((workdir / out / "summary.json").read_text())["settings"]["default"]["metrics"]
        return {k: v for k, v in s.items() if k not in ("tokens_per_s", "gen_seconds")}

    assert numbers("killed") == numbers("unkilled")
    key = lambda r: (r["index"], r["sample"])  # noqa: E731
    a = sorted(read_records(workdir / "killed" / "items" / "default.jsonl"), key=key)
    b = sorted(read_records(workdir / "unkilled" / "items" / "default.jsonl"), key=key)
    fields = ("completion", "nfe", "reward", "seed")
    assert [[r[f] for f in fields] for r in a] == [[r[f] for f in fields] for r in b]


def test_plot_draws_a_diverged_run_and_says_where_it_writes(tmp_path, capsys):
    """A metric of 1e308 or a null step used to be a traceback, ``-o DIR`` wrote ``DIR.png`` and ``-o out.txt``
    failed in matplotlib after drawing: points that cannot be drawn are left out, a directory gets
    dashboard.png, and a suffix matplotlib does not write is refused before drawing."""
    from dllm_rl.training.plots import series

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "reward": 0.1}, {"step": 1, "reward": 1e308}, {"step": None, "reward": 0.3},
            {"step": 3, "reward": float("nan")}, {"step": 4, "reward": -1e308, "kl": 1e308}, {"step": 5, "reward": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, values = series([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()], "reward")
    assert steps.tolist() == [0.0, 5.0] and values.tolist() == [0.1, 0.5]
    assert _main(["plot", str(run), "--per-metric"]) == 0
    assert (run / "dashboard.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["kl.png", "reward.png"]
    out_dir = tmp_path / "figs"
    out_dir.mkdir()
    capsys.readouterr()
    assert _main(["plot", str(run), "-o", str(out_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(out_dir / "dashboard.png")
    assert (out_dir / "dashboard.png").is_file() and not (tmp_path / "figs.png").exists()
    assert _main(["plot", str(run), "-o", str(tmp_path / "d.pdf")]) == 0
    assert (tmp_path / "d.pdf").read_bytes()[:4] == b"%PDF"
    for bad, what in (("out.txt", ".txt"), ("out", "no suffix")):
        with pytest.raises(ValueError, match=rf"^-o {tmp_path / bad}: not an image file name \({what}\); give "
                                             "FILE.png, FILE.pdf or FILE.svg"):
            _main(["plot", str(run), "-o", str(tmp_path / bad)])
        assert not (tmp_path / bad).exists() and not (tmp_path / f"{bad}.png").exists()


@pytest.fixture()
def fake_eval(monkeypatch) -> list:
    """``run_eval`` replaced by one that records the config and writes a summary: what the command line gives."""
    import dllm_rl.eval.harness as harness

    seen = []

    def run(cfg):
        seen.append(cfg)
        Path(cfg.run.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.run.output_dir) / "summary.md").write_text("| setting |\n")
        return {"settings": {}}

    monkeypatch.setattr(harness, "run_eval", run)
    return seen


def test_eval_reads_a_yaml_overrides_and_flags(tmp_path, fake_eval, capsys):
    from dllm_rl.cli import main

    (tmp_path / "e.yaml").write_text("task: countdown\nlimit: 5\ndecode:\n  gen_length: 16\n"
                                     "setting: [dyn:threshold=0.9]\n")
    assert main(["eval", "ckpt", str(tmp_path / "e.yaml"), "decode.block_length=8", "--num-samples", "2",
                 "--thresholds", "0.5,0.7", "--thresholds", "0.9", "--task-options", "task_type=countdown",
                 "--setting", "s1:tokens_per_step=1", "-o", str(tmp_path / "o"), "--no-run.progress"]) == 0
    (cfg,) = fake_eval
    assert (cfg.model.path, cfg.task, cfg.limit, cfg.num_samples, cfg.decode.gen_length, cfg.decode.block_length,
            cfg.thresholds, cfg.task_options, cfg.setting, cfg.run.output_dir, cfg.run.progress) == (
        "ckpt", "countdown", 5, 2, 16, 8, [0.5, 0.7, 0.9], {"task_type": "countdown"}, ["s1:tokens_per_step=1"],
        str(tmp_path / "o"), False)
    assert cfg.command.startswith("dllm-rl eval ckpt ") and capsys.readouterr().out == "| setting |\n\n"
    # no -o: runs/eval/MODEL-TASK-SPLIT, as before; the task type is a task option
    assert main(["eval", "model.path=ckpt", "--task", str(tmp_path / "cd.jsonl"), "--task-type", "countdown"]) == 0
    assert fake_eval[-1].run.output_dir == str(Path("runs") / "eval" / "ckpt-cd-test")
    assert fake_eval[-1].task_options == {"task_type": "countdown"}


def test_eval_keeps_its_old_flags_with_a_deprecation_line(tmp_path, fake_eval):
    from dllm_rl.cli import main
    from dllm_rl.config.renames import DeprecatedKey

    with pytest.warns(DeprecatedKey) as caught:
        assert main(["eval", "ckpt", "--task", "countdown", "--gen-length", "16", "--block-size", "8",
                     "--tokenizer", "tok", "--device", "cpu", "--seed", "3", "--output", str(tmp_path / "o"),
                     "--no-progress", "--task-option", "a=1", "--task-option", "b=x"]) == 0
    said = {str(w.message).split(" (the old key")[0] for w in caught}
    assert said == {f"config key {old!r} is deprecated: use {new!r}" for old, new in (
        ("gen_length", "decode.gen_length"), ("block_size", "decode.block_size"), ("tokenizer", "model.tokenizer"),
        ("device", "model.device"), ("seed", "run.seed"), ("output", "run.output_dir"),
        ("progress", "run.progress"), ("task_option", "task_options"))}
    cfg = fake_eval[-1]
    assert (cfg.decode.gen_length, cfg.decode.block_size, cfg.model.tokenizer, cfg.model.device, cfg.run.seed,
            cfg.run.output_dir, cfg.run.progress, cfg.task_options) == (16, 8, "tok", "cpu", 3, str(tmp_path / "o"),
                                                                        False, {"a": 1, "b": "x"})


def test_eval_help_config_lists_every_key(capsys):
    from dllm_rl.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["eval", "--help-config"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for start in ("model.path (default '')", "decode.gen_length (default 64)", "setting (default [])",
                  "thresholds (default [])", "task_options (default {})", "demo (default False)",
                  "json (default False)", "run.output_dir (default 'runs/eval/MODEL-TASK-SPLIT')"):
        assert any(line.startswith(start) for line in lines), start


def test_trace_reads_a_yaml_overrides_flags_and_old_flags(tmp_path, monkeypatch):
    import dllm_rl.eval.cli as eval_cli
    import dllm_rl.eval.trace_viewer as viewer
    from dllm_rl.cli import main
    from dllm_rl.config.renames import DeprecatedKey

    seen = []
    monkeypatch.setattr(eval_cli, "_decode_for_trace", lambda cfg, tok_dir: (seen.append(cfg) or [], {}))
    monkeypatch.setattr(viewer, "write_html", lambda path, records, **kw: Path(path))
    (tmp_path / "t.yaml").write_text("prompt: [hello]\ndecode:\n  steps: 2\n")
    with pytest.warns(DeprecatedKey, match="config key 'dtype' is deprecated: use 'model.dtype'"):
        assert main(["trace", "ckpt", str(tmp_path / "t.yaml"), "decode.gen_length=8", "--prompt", "bye",
                     "--decode.block-length", "4", "--dtype", "float32", "-o", str(tmp_path / "t.html")]) == 0
    (cfg,) = seen
    assert (cfg.model.path, cfg.prompt, cfg.decode.steps, cfg.decode.gen_length, cfg.decode.block_length,
            cfg.model.dtype, cfg.output) == ("ckpt", ["bye"], 2, 8, 4, "float32", str(tmp_path / "t.html"))


def test_plot_takes_several_runs_from_bare_words_or_a_yaml(tmp_path):
    from dllm_rl.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 10, "kl": 0.01 * s}) + "\n"
                                               for s in range(3)))
    (tmp_path / "p.yaml").write_text(f"runs: [{run}]\nper_metric: true\n")
    assert main(["plot", str(tmp_path / "p.yaml"), "keys=[reward]"]) == 0
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["reward.png"]
    assert main(["plot", str(run), "--per-metric", "--keys", "reward", "kl"]) == 0  # several at once, as before
    assert sorted(p.name for p in (run / "plots").iterdir()) == ["kl.png", "reward.png"]
    assert main(["plot", str(run), str(run), "--output", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").is_file()
