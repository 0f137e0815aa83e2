"""`dllm-rl generate`: parser registration, completions on stdout, the --trace JSONL."""

import argparse
import json

import pytest

from dllm_rl.errors import UserError
from dllm_rl.models import build_model, char_tokenizer, load_tokenizer, save_model, tiny_config
from dllm_rl.sampling.cli import read_prompts_file, register


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = char_tokenizer("abcdefgh ")  # 4 specials + 9 characters = 13 ids
    cfg = tiny_config("llada", vocab_size=16, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("ckpt")
    save_model(build_model("llada", cfg, seed=0), path, tokenizer=tok)
    return path


def _run(argv):
    parser = argparse.ArgumentParser(prog="dllm-rl")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_generate_prints_completions_and_writes_trace(model_dir, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "bad"}) + "\n\n" + json.dumps("cafe") + "\n")
    rc = _run(["generate", str(model_dir), "--prompt", "abc", "--prompts-file", str(prompts), "--gen-length", "8",
               "--block-length", "4", "--steps", "2", "--no-stop-on-eos", "--trace", str(trace)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("=== [") == 3
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["abc", "bad", "cafe"]
    tok = load_tokenizer(model_dir)
    assert [r["prompt_ids"] for r in rows] == [tok.encode(t, add_special_tokens=False) for t in ("abc", "bad", "cafe")]
    for r in rows:
        assert len(r["token_ids"]) == len(r["tokens"]) == len(r["steps"]) == len(r["confidence"]) == 8
        assert sorted(r["steps"]) == [0, 0, 1, 1, 2, 2, 3, 3]  # 2 steps per block, 2 tokens per step
        assert r["nfe"] == 4 and r["finish_reason"] in ("eos", "length")
        assert all(0.0 <= c <= 1.0 for c in r["confidence"])
        assert r["decode_config"]["steps"] == 2 and r["decode_config"]["decode_block_length"] == 4
        assert r["completion"] in out


def test_generate_errors_are_clear(model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_prompts_file(bad)
    with pytest.raises(ValueError, match="at least one --prompt"):
        _run(["generate", str(model_dir)])
    with pytest.raises(ValueError, match="threshold"):
        _run(["generate", str(model_dir), "--prompt", "a", "--threshold", "1.5"])
    with pytest.raises(ValueError, match="multiple of block_length"):
        _run(["generate", str(model_dir), "--prompt", "a", "--gen-length", "6", "--block-length", "4"])


def test_generate_slots_decodes_with_the_engine_to_the_same_trace(model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": t}) for t in ("abc", "bad", "cafe", "h", "ffff")) + "\n")
    common = ["generate", str(model_dir), "--prompts-file", str(prompts), "--gen-length", "8", "--block-length", "4",
              "--threshold", "0.3", "--confidence", "random", "--temperature", "1.0", "--no-stop-on-eos",
              "--progress"]
    rows = {}
    for name, extra in (("fixed", ["--batch-size", "5"]), ("engine", ["--slots", "2"])):
        assert _run([*common, *extra, "--trace", str(tmp_path / f"{name}.jsonl")]) == 0
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    out = capsys.readouterr().out
    assert "5 prompts" in out and "(2 slots)" in out  # the engine's progress line
    assert [{k: r[k] for k in ("token_ids", "steps", "nfe")} for r in rows["engine"]] == \
        [{k: r[k] for k in ("token_ids", "steps", "nfe")} for r in rows["fixed"]]
    assert len({r["nfe"] for r in rows["fixed"]}) > 1  # rows finished after different numbers of steps
    rcr = ["generate", str(model_dir), "--prompts-file", str(prompts), "--gen-length", "8", "--block-length", "4",
           "--remasking", "rcr", "--steps", "4", "--temperature", "1.0"]
    for name, extra in (("rcr-fixed", []), ("rcr-engine", ["--slots", "2"])):  # RCR decodes in the engine too
        assert _run([*rcr, *extra, "--trace", str(tmp_path / f"{name}.jsonl")]) == 0
        rows[name] = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert [{k: r[k] for k in ("token_ids", "steps", "nfe")} for r in rows["rcr-engine"]] == \
        [{k: r[k] for k in ("token_ids", "steps", "nfe")} for r in rows["rcr-fixed"]]
    with pytest.raises(UserError, match=r"^--slots: must be >= 1, got 0$"):  # GenerateOptions' range
        _run(["generate", str(model_dir), "--prompt", "a", "--slots", "0"])
