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
    with pytest.raises(UserError, match=r"^slots: must be >= 1, got 0$"):  # GenerateConfig's range
        _run(["generate", str(model_dir), "--prompt", "a", "--slots", "0"])


def _trace(path):
    return [{k: r[k] for k in ("prompt", "token_ids", "steps", "decode_config")}
            for r in map(json.loads, path.read_text().splitlines())]


def test_generate_takes_a_yaml_overrides_and_flags_and_its_old_flags_with_a_deprecation(model_dir, tmp_path):
    """`dllm-rl generate CONFIG.yaml key=value --key value` decodes as the old flags (still read, each with its
    one-line deprecation) do; the decode keys land in the trace's decode_config."""
    from dllm_rl.cli import main
    from dllm_rl.config.renames import DeprecatedKey

    (tmp_path / "g.yaml").write_text(f"model:\n  path: {model_dir}\ndecode:\n  gen_length: 8\n  steps: 4\n"
                                     "prompt: [abc, bad]\n")
    assert main(["generate", str(tmp_path / "g.yaml"), "decode.block_length=4", "--decode.steps", "2",
                 "--no-decode.stop-on-eos", "--model.device", "cpu", "--trace", str(tmp_path / "new.jsonl")]) == 0
    with pytest.warns(DeprecatedKey) as warned:
        assert main(["generate", str(model_dir), "--prompt", "abc", "--prompt", "bad", "--gen-length", "8",
                     "--block-length", "4", "--steps", "2", "--no-stop-on-eos", "--device", "cpu", "--dtype", "float32",
                     "--trace", str(tmp_path / "old.jsonl")]) == 0
    assert sorted(str(w.message).split(" is deprecated")[0] for w in warned) == [
        f"config key {k!r}" for k in ("block_length", "device", "dtype", "gen_length", "steps", "stop_on_eos")]
    assert "config key 'gen_length' is deprecated: use 'decode.gen_length'" in "".join(str(w.message) for w in warned)
    new = _trace(tmp_path / "new.jsonl")
    assert new == _trace(tmp_path / "old.jsonl") and [r["prompt"] for r in new] == ["abc", "bad"]
    assert {k: new[0]["decode_config"][k] for k in ("gen_length", "block_length", "steps", "stop_on_eos")} == {
        "gen_length": 8, "block_length": 4, "steps": 2, "stop_on_eos": False}


def test_generate_reads_the_preset_and_the_uniform_knobs_where_it_did(capsys):
    """The old --preset and DiffusionGemma's flags (--max-denoising-steps, --t-max ...) are the decode section's
    keys; the model section's device defaults to auto (it was cpu)."""
    from dllm_rl.cli import build_parser, main, parse_words
    from dllm_rl.config.command import load_command
    from dllm_rl.config.vocabulary import ModelSection
    from dllm_rl.sampling.config import GenerateConfig

    def load(*argv):
        args = parse_words(build_parser("generate"), ["generate", *argv])
        return load_command(GenerateConfig, args, "", positional="model.path")

    with pytest.warns(FutureWarning, match="'preset' is deprecated: use 'decode.preset'"):
        cfg = load("ckpt", "--preset", "fast_dllm_v2", "--sub-block", "16")
    assert cfg.model == ModelSection(path="ckpt", device="auto", dtype="auto")
    assert (cfg.decode.decode_config().threshold, cfg.decode.decode_config().sub_block) == (0.9, 16)
    with pytest.warns(FutureWarning):
        cfg = load("model.path=gemma", "--max-denoising-steps", "12", "--t-max", "0.9", "decode.t_min=0.2")
    assert (cfg.model.path, cfg.decode.max_denoising_steps, cfg.decode.t_max, cfg.decode.t_min) == ("gemma", 12, 0.9,
                                                                                                  0.2)
    assert main(["generate", "--prompt", "a"]) == 2
    assert capsys.readouterr().err == ("dllm-rl generate: error: give the model: dllm-rl generate MODEL_DIR --prompt "
                                       "TEXT (or model.path=DIR, or a config file that names it)\n")
    assert main(["generate", "m", "--decode.preset", "nope"]) == 2
    assert "decode.preset: 'nope' is not allowed; choose one of llada2, fast_dllm_v2" in capsys.readouterr().err
