"""Renamed config keys keep working for one release: carried to their new place with one warning line naming the
new key (from a YAML file, an override, a checkpoint's config.yaml), and the generated reference is current."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dllm_rl.config import ConfigError, load_config
from dllm_rl.config.renames import DeprecatedKey, carry_renamed
from dllm_rl.dpo.config import DPOConfig
from dllm_rl.rl.config import RLConfig
from dllm_rl.sft.config import SFTConfig

ROOT = Path(__file__).resolve().parents[2]


def test_old_rl_keys_in_a_file_and_overrides_land_in_their_sections(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("model: ckpt\ntask: gsm8k\ntrain_data: t.jsonl\nmax_steps: 7\nnum_generations: 4\n"
                    "seed: 3\nlog_samples_every: 2\ntrain_block_size: 8\nrollout:\n  gen_length: 16\n")
    with pytest.warns(DeprecatedKey) as caught:
        cfg = load_config(RLConfig, path, ["prompts_per_step=5", "resume=latest", "reward_timeout_s=2"])
    assert (cfg.model.path, cfg.data.task, cfg.data.train_file, cfg.train.max_steps) == ("ckpt", "gsm8k", "t.jsonl", 7)
    assert (cfg.rollout.num_generations, cfg.rollout.gen_length, cfg.run.seed, cfg.log.samples_every) == (4, 16, 3, 2)
    assert (cfg.train.block_size, cfg.train.prompts_per_step, cfg.run.resume, cfg.reward.timeout_s) == (8, 5, "latest",
                                                                                                        2)
    assert cfg.run.output_dir == "runs/rl"  # a section given in part keeps its command's defaults
    messages = [str(w.message) for w in caught]
    assert "config key 'max_steps' is deprecated: use 'train.max_steps' (the old key is read until the next release)" \
        in messages
    assert "config key 'model' is deprecated: use 'model.path' (the old key is read until the next release)" in messages
    assert len(messages) == 11


def test_the_new_layout_warns_nothing_and_both_spellings_of_one_key_are_refused(tmp_path, recwarn):
    cfg = load_config(RLConfig, None, ["model.path=m", "train.max_steps=3", "model.dtype=bfloat16"])
    assert (cfg.model.path, cfg.train.max_steps, cfg.model.dtype) == ("m", 3, "bfloat16")
    assert not [w for w in recwarn if issubclass(w.category, DeprecatedKey)]
    path = tmp_path / "both.yaml"
    path.write_text("max_steps: 3\ntrain:\n  max_steps: 4\n")
    with pytest.raises(ConfigError, match=r"both 'max_steps' \(deprecated\) and 'train.max_steps' are given; keep "
                                          r"'train.max_steps' only"):
        load_config(RLConfig, path)


def test_old_sft_keys_and_values_mean_what_they_meant():
    with pytest.warns(DeprecatedKey):
        cfg = load_config(SFTConfig, None, ["train.output_dir=out", "train.seed=4", "train.resume=none",
                                            "train.keep_checkpoints=null", "train.max_steps=9"])
    assert (cfg.run.output_dir, cfg.run.seed, cfg.run.resume, cfg.run.keep_checkpoints) == ("out", 4, None, 0)
    assert cfg.train.max_steps == 9
    assert load_config(SFTConfig).run.output_dir == "runs/sft"


def test_a_typo_of_an_old_key_suggests_its_new_name():
    with pytest.raises(ConfigError, match="did you mean 'rollout.num_generations'"):
        load_config(RLConfig, None, ["num_generation=4"])


def test_a_checkpoint_config_of_the_flat_layout_compares_like_the_new(tmp_path):
    saved = {"model": "m", "max_steps": 3, "rollout": {"gen_length": 8}}
    assert carry_renamed(RLConfig, saved, warn=False) == {"model": {"path": "m"}, "train": {"max_steps": 3},
                                                          "rollout": {"gen_length": 8}}


def test_the_cli_prints_a_deprecation_as_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dllm_rl", "rl", str(ROOT / "configs" / "llada-espo-gsm8k.yaml"),
                          "max_steps=0"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "dllm-rl: warning: config key 'max_steps' is deprecated: use 'train.max_steps' (the old key is read until "
        "the next release)",
        f"dllm-rl rl: error: {ROOT / 'configs' / 'llada-espo-gsm8k.yaml'}: train.max_steps: must be >= 1, got 0"]


def test_the_generated_docs_are_current():
    """docs/config.md and the preset table of docs/methods.md equal what ``make docs`` writes."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from make_docs import generated
    finally:
        sys.path.pop(0)
    files = generated(ROOT)
    assert sorted(p.relative_to(ROOT).as_posix() for p in files) == ["docs/config.md", "docs/methods.md"]
    assert [p.relative_to(ROOT).as_posix() for p, text in files.items() if p.read_text() != text] == [], \
        "run: make docs"


@pytest.mark.parametrize("override", [["rollout.steps=4", "rollout.threshold=0.9"],
                                      ["eval.steps=4", "eval.threshold=0.9"]])
def test_one_schedule_rule_everywhere(override):
    """steps and threshold together are refused in RL's rollout and held-out sections as by the sampler itself."""
    from dllm_rl.sampling.config import SCHEDULE_RULE, DecodeConfig

    section = override[0].split(".")[0]
    with pytest.raises(ConfigError, match=rf"^{section}.threshold: {re.escape(SCHEDULE_RULE)}$"):
        load_config(RLConfig, None, override)
    with pytest.raises(ConfigError, match=rf"^threshold: {re.escape(SCHEDULE_RULE)}$"):
        DecodeConfig(steps=4, threshold=0.9)


def test_every_command_with_a_config_has_help_config(capsys):
    from dllm_rl.cli import main

    firsts = {}
    for command in ("rl", "demo", "sft", "eval", "generate", "trace", "plot", "serve"):
        with pytest.raises(SystemExit) as stop:
            assert main([command, "--help-config"]) == 0
            raise SystemExit(0)
        assert stop.value.code == 0
        firsts[command] = capsys.readouterr().out.splitlines()
    assert firsts["demo"][firsts["demo"].index("") + 1:] == firsts["rl"]  # the demo's own options, then rl's keys
    assert "run.output_dir (default 'runs/rl')" in firsts["rl"][1]
    assert "run.output_dir (default 'runs/sft')" in firsts["sft"][1]
    assert any(line.startswith("limit (default None)") for line in firsts["eval"])
    assert any(line.startswith("decode.threshold (default None)") for line in firsts["eval"])
    assert any(line.startswith("decode.gen_length (default 64): ") for line in firsts["trace"])
    assert firsts["plot"][0].startswith("runs (default [])")
    assert firsts["generate"][1].startswith("model.path (default '')")
    assert "model.device (default 'auto')" in "\n".join(firsts["generate"] + firsts["serve"])
    assert any(line.startswith("slots (default 32)") for line in firsts["serve"])


@pytest.mark.parametrize("cls", [SFTConfig, DPOConfig], ids=["sft", "dpo"])
def test_train_cpu_is_model_device(cls, tmp_path):
    """SFT / DPO's ``train.cpu`` switch became the shared ``model.device`` key: true is cpu, false auto."""
    path = tmp_path / "old.yaml"
    path.write_text("train:\n  cpu: true\n")
    with pytest.warns(DeprecatedKey, match=r"^config key 'train.cpu' is deprecated: use 'model.device' "):
        assert load_config(cls, path).model.device == "cpu"
    with pytest.warns(DeprecatedKey, match="'train.cpu' is deprecated"):
        assert load_config(cls, None, ["train.cpu=false"]).model.device == "auto"
    assert load_config(cls, None, ["model.device=cpu"]).model.device == "cpu"
    saved = carry_renamed(cls, {"train": {"cpu": True, "max_steps": 2}}, warn=False)
    assert saved == {"train": {"max_steps": 2}, "model": {"device": "cpu"}}  # a checkpoint's config.yaml


@pytest.mark.parametrize("command", ["sft", "dpo"])
def test_the_old_cpu_switch_stays_a_switch(command):
    from dllm_rl.cli import build_parser, parse_words
    from dllm_rl.config.command import load_command

    cls = {"sft": SFTConfig, "dpo": DPOConfig}[command]
    for argv, device in ((["--train.cpu"], "cpu"), (["--no-train.cpu"], "auto"), (["--model.device", "cpu"], "cpu")):
        args = parse_words(build_parser(command), [command, *argv])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert load_command(cls, args, "x.yaml").model.device == device
        assert [str(w.message)[:57] for w in caught] == (
            ["config key 'train.cpu' is deprecated: use 'model.device' "] if "train" in argv[0] else [])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_sft_refuses_a_device_this_machine_lacks_in_one_line(tmp_path, capsys):
    from dllm_rl.cli import main

    assert main(["sft", "model.tokenizer=char", "model.device=cuda:7", f"run.output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dllm-rl sft: error: model.device 'cuda:7': this machine has no cuda device (it has: cpu")
    assert not (tmp_path / "out").exists()


def _messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecatedKey)]


def test_old_dtype_spellings_read_as_the_shared_words(tmp_path):
    """fp32 / bf16 / fp16 (RL's model.dtype and rollout.dtype took them) are float32 / bfloat16 / float16, from a
    file (its flat old key too), an override or a checkpoint's config.yaml, each with one deprecation line."""
    path = tmp_path / "old.yaml"
    path.write_text("dtype: bf16\nrollout:\n  dtype: fp16\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(RLConfig, path, ["reward.dtype=fp32", "reward.judge.dtype=bf16"])
    assert (cfg.model.dtype, cfg.rollout.dtype, cfg.reward.dtype, cfg.reward.judge.dtype) == (
        "bfloat16", "float16", "float32", "bfloat16")
    assert _messages(caught) == [
        "config key 'dtype' is deprecated: use 'model.dtype' (the old key is read until the next release)",
        "config value model.dtype: 'bf16' is deprecated: use 'bfloat16' (the old value is read until the next release)",
        "config value rollout.dtype: 'fp16' is deprecated: use 'float16' (the old value is read until the next "
        "release)",
        "config value reward.dtype: 'fp32' is deprecated: use 'float32' (the old value is read until the next "
        "release)",
        "config value reward.judge.dtype: 'bf16' is deprecated: use 'bfloat16' (the old value is read until the next "
        "release)"]
    with pytest.warns(DeprecatedKey, match=r"^config value model.dtype: 'bf16' is deprecated: use 'bfloat16'"):
        assert load_config(SFTConfig, None, ["model.dtype=bf16"]).model.dtype == "bfloat16"
    assert carry_renamed(RLConfig, {"model": {"dtype": "bf16"}}, warn=False) == {"model": {"dtype": "bfloat16"}}
    with pytest.raises(ConfigError, match=r"^model.dtype: 'bf32' is not allowed; choose one of auto, float32, "
                                          r"bfloat16, float16$"):
        load_config(DPOConfig, None, ["model.dtype=bf32"])


def test_every_dtype_key_takes_the_same_words_and_trainers_keep_float32():
    for cls in (RLConfig, SFTConfig, DPOConfig):
        assert load_config(cls).model.dtype == "float32"
        assert load_config(cls, None, ["model.dtype=auto"]).model.dtype == "auto"
        assert load_config(cls, None, ["model.dtype=float16"]).model.dtype == "float16"
    cfg = load_config(RLConfig, None, ["rollout.dtype=auto", "reward.dtype=float16", "reward.judge.dtype=auto"])
    assert (cfg.rollout.dtype, cfg.reward.dtype, cfg.reward.judge.dtype) == ("auto", "float16", "auto")


@pytest.mark.parametrize("command", ["sft", "dpo"])
def test_tokenizer_auto_is_null_the_checkpoints_own(command, tmp_path):
    """SFT / DPO's ``model.tokenizer: auto`` is the shared null (the checkpoint's own), from a file, an override, a
    flag and a checkpoint's config.yaml (silently, so a resume compares like with like)."""
    from dllm_rl.cli import build_parser, parse_words
    from dllm_rl.config.command import load_command

    cls = {"sft": SFTConfig, "dpo": DPOConfig}[command]
    assert load_config(cls).model.tokenizer is None
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  path: ckpt\n  tokenizer: auto\n")
    line = "config value model.tokenizer: 'auto' is deprecated: use null (the old value is read until the next release)"
    for args in ((path, []), (None, ["model.tokenizer=auto"])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert load_config(cls, *args).model.tokenizer is None
        assert _messages(caught) == [line]
    with pytest.warns(DeprecatedKey, match="'auto' is deprecated: use null"):
        cfg = load_command(cls, parse_words(build_parser(command), [command, "--model.tokenizer", "auto"]), "x.yaml")
    assert cfg.model.tokenizer is None
    assert load_config(cls, None, ["model.tokenizer=char"]).model.tokenizer == "char"
    assert carry_renamed(cls, {"model": {"tokenizer": "auto"}}, warn=False) == {"model": {"tokenizer": None}}


def test_a_fresh_model_without_a_tokenizer_is_one_line(tmp_path, capsys):
    from dllm_rl.cli import main

    assert main(["sft", f"run.output_dir={tmp_path / 'out'}", "model.device=cpu"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dllm-rl sft: error: model.tokenizer: null is the checkpoint's own tokenizer and there is no checkpoint "
        "(model.path: null builds a fresh model); set model.tokenizer=char or a tokenizer directory, or model.path")


@pytest.mark.parametrize("cls", [SFTConfig, DPOConfig], ids=["sft", "dpo"])
def test_train_batch_size_is_the_micro_batch_size(cls, tmp_path):
    """SFT / DPO's per-process micro-batch, ``train.batch_size``, is ``train.micro_batch_size`` as in RL."""
    path = tmp_path / "old.yaml"
    path.write_text("train:\n  batch_size: 3\n  grad_accum: 2\n")
    with pytest.warns(DeprecatedKey, match=r"^config key 'train.batch_size' is deprecated: use "
                                           r"'train.micro_batch_size' \(the old key is read until the next release\)$"):
        cfg = load_config(cls, path)
    assert (cfg.train.micro_batch_size, cfg.train.grad_accum) == (3, 2)
    with pytest.warns(DeprecatedKey, match="'train.batch_size' is deprecated"):
        assert load_config(cls, None, ["train.batch_size=5"]).train.micro_batch_size == 5
    with pytest.raises(ConfigError, match=r"^train.micro_batch_size: must be >= 1, got 0$"), \
            pytest.warns(DeprecatedKey):
        load_config(cls, None, ["train.batch_size=0"])
    saved = carry_renamed(cls, {"train": {"batch_size": 4}}, warn=False)
    assert saved == {"train": {"micro_batch_size": 4}}


def test_the_reference_lists_the_old_values_under_their_keys():
    from dllm_rl.config.reference import markdown

    lines = markdown([("dllm-rl sft", SFTConfig, None), ("dllm-rl rl", RLConfig, None)]).splitlines()
    old = "; ".join(["`model.tokenizer`: `auto` → `null`", "`model.dtype`: `fp32` → `float32`, `bf16` → `bfloat16`, "
                     "`fp16` → `float16`."])
    assert f"Values of earlier releases, still read with a one-line deprecation warning: {old}" in lines
    assert ("Values of earlier releases, still read with a one-line deprecation warning: `model.dtype`, "
            "`reward.dtype`, `reward.judge.dtype`, `rollout.dtype`: `fp32` → `float32`, `bf16` → `bfloat16`, "
            "`fp16` → `float16`.") in lines
