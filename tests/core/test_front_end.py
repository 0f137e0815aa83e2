"""The one command front end (``dllm_rl.config.command``): ``dllm-rl COMMAND [CONFIG.yaml] [key=value ...]
[--key value ...]``, its flags generated from the command's config dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

import pytest
from front_end_table import COMMANDS, config_class, options_class

from dllm_rl.cli import OneLineParser, build_parser, main, parse_words
from dllm_rl.config import ConfigError, field
from dllm_rl.config.command import (
    add_command_arguments,
    flag_name,
    given_flags,
    leaf_keys,
    load_command,
    negative_flags,
    old_flag_type,
    option_flag,
)
from dllm_rl.config.renames import DeprecatedKey, renames

#: options of a command that are no config key
NOT_KEYS = {"-h", "--help", "--help-config"}


def _subparser(command: str) -> argparse.ArgumentParser:
    """The parser of ``command``: a subcommand, or a subcommand's own (``data make``)."""
    parser = build_parser(command.split()[0])
    for word in command.split():
        parser = parser._subparsers._group_actions[0].choices[word]
    return parser


def _usage_words(cls: type, positional: str | None) -> str:
    """What a command's usage names before its config words (``[MODEL_DIR] ``, plot's ``[RUN_DIR ...] ``)."""
    return {None: "", "model.path": "[MODEL_DIR] ", "runs": "[RUN_DIR ...] ", "task": "[TASK] "}[positional]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_key_is_a_flag_and_every_flag_a_key(command):
    """A command's flags are its config's keys (a bool's --no- too, a renamed key's old flag hidden, its short
    flags), and those of its own options (demo's DemoOptions), whose flags win over an old flag of the same name."""
    cls, own = config_class(command), options_class(command)
    keys = {key for key, _, _ in leaf_keys(cls)}
    options = {option_flag(own, k): f"option:{k}" for k, _, _ in leaf_keys(own)} if own else {}
    flags = {}
    for action in _subparser(command)._actions:
        for option in action.option_strings:
            if option not in NOT_KEYS:
                flags[option] = action.dest
    bools = {no for k, f, tp in leaf_keys(cls) if tp in (bool, bool | None) for no in negative_flags(flag_name(k))}
    old = {key: new for key, (new, _) in renames(cls).items()
           if new in keys and key not in keys and flag_name(key) not in options}
    types = {k: tp for k, _, tp in leaf_keys(cls)}
    old_bools = {no for k, (new, convert) in renames(cls).items()
                 if k in old and old_flag_type(convert, types[new]) in (bool, bool | None)
                 for no in negative_flags(flag_name(k))}
    short = set(getattr(cls, "SHORT_FLAGS", {}))
    assert set(flags) == ({flag_name(k) for k in keys} | bools | {flag_name(k) for k in old} | old_bools | short
                          | set(options))
    assert {dest for dest in flags.values()} == {f"config:{k}" for k in keys | set(old)} | set(options.values())
    assert all(flags[flag_name(k)] == f"config:{k}" for k in keys)
    assert all(flags[flag] == dest for flag, dest in options.items())
    assert _subparser(command).format_usage() == (f"usage: dllm-rl {command} {_usage_words(cls, COMMANDS[command][2])}"
                                                   "[CONFIG.yaml] [key=value ...] [--KEY VALUE ...]\n")


def test_rl_takes_overrides_and_flags_without_a_yaml(monkeypatch):
    import dllm_rl.rl.loop

    seen = []
    monkeypatch.setattr(dllm_rl.rl.loop, "train", lambda cfg: seen.append(cfg) or {"is_main": False})
    assert main(["rl", "algorithm=tracerl", "--train.max-steps", "3", "beta=0.5", "--run.overwrite"]) == 0
    (cfg,) = seen
    assert (cfg.algorithm, cfg.train.max_steps, cfg.beta, cfg.run.overwrite) == ("tracerl", 3, 0.5, True)


def test_demo_takes_its_own_options_a_yaml_overrides_and_every_rl_flag(monkeypatch, tmp_path, capsys):
    """``demo``: --model / --recipe / --output-dir are the demo's (DemoOptions), everything else an RL key laid over
    the demo config and its recipes (a YAML, then key=value, then --key value); --algorithm is RL's key."""
    import dllm_rl.rl.loop

    seen = []
    monkeypatch.setattr(dllm_rl.rl.loop, "train", lambda cfg: seen.append(cfg) or {
        "accuracy_before": 0.25, "accuracy_after": 0.5, "minutes": 1.0, "output_dir": cfg.run.output_dir})
    assert main(["demo", "--model", "gemma", "--train.max-steps", "1", "beta=0"]) == 0
    cfg = seen[-1]
    assert (cfg.algorithm, cfg.train.max_steps, cfg.beta, cfg.run.output_dir, cfg.run.overwrite) == (
        "espo", 1, 0.0, "runs/demo/gemma-espo", True)
    assert cfg.model.path.endswith("gemma-countdown") and cfg.eval.data.endswith("countdown_heldout.jsonl")
    assert (cfg.estimator, cfg.advantage) == ("uniform_denoise", "raft")  # the gemma demo's ESPO recipe
    assert ("demo (espo on the DiffusionGemma-shaped model): held-out accuracy 25.0% -> 50.0% in 1.0 min; "
            "curves in runs/demo/gemma-espo/dashboard.png") in capsys.readouterr().out
    (tmp_path / "mine.yaml").write_text("train:\n  max_steps: 5\nbeta: 0.01\n")
    assert main(["demo", str(tmp_path / "mine.yaml"), "--algorithm", "espo", "--recipe", "speed", "--output-dir",
                 str(tmp_path), "--run.resume", "latest", "train.ema_decay=0.5"]) == 0
    cfg = seen[-1]  # the YAML and the override win over the recipes (ESPO's 120 steps, its ema_decay 0.9)
    assert (cfg.algorithm, cfg.train.max_steps, cfg.beta, cfg.train.ema_decay, cfg.reward.normalization) == (
        "espo", 5, 0.01, 0.5, "decoupled")
    assert (cfg.run.output_dir, cfg.run.resume, cfg.run.overwrite) == (f"{tmp_path}/block-espo-speed", "latest", False)
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--model", "large"])
    assert stop.value.code == 2
    assert "argument --model: invalid choice: 'large'" in capsys.readouterr().err


def test_a_flag_wins_over_the_yaml_and_an_override(monkeypatch, tmp_path):
    import dllm_rl.rl.loop

    seen = []
    monkeypatch.setattr(dllm_rl.rl.loop, "train", lambda cfg: seen.append(cfg) or {"is_main": False})
    (tmp_path / "c.yaml").write_text("beta: 0.1\ntrain:\n  max_steps: 7\n")
    assert main(["rl", "--beta", "0.3", str(tmp_path / "c.yaml"), "beta=0.2"]) == 0
    assert (seen[0].beta, seen[0].train.max_steps) == (0.3, 7)


def test_a_command_given_nothing_or_a_bad_flag_value_is_one_line(capsys):
    assert main(["rl"]) == 2
    assert capsys.readouterr().err.strip() == ("dllm-rl rl: error: give a config file (e.g. "
                                               "configs/llada-espo-gsm8k.yaml), key=value overrides and/or --key "
                                               "value flags")
    assert main(["sft", "--train.max-steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "dllm-rl sft: error: train.max_steps: must be >= 1, got 0"
    with pytest.raises(SystemExit) as stop:
        main(["dpo", "beta=0.1", "--no-such-key", "1"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --no-such-key 1" in capsys.readouterr().err


@dataclasses.dataclass
class _Inner:
    size: int = field(2, ge=1, help="a size")


@dataclasses.dataclass
class _Small:
    model_dir: str | None = field(None, help="where the model is")
    prompt: list[str] = field(default_factory=list, help="prompts")
    chat: bool = field(False, help="chat")
    inner: _Inner = field(default_factory=_Inner, help="a section")


def test_list_bool_section_flags_and_a_positional_word():
    parser = OneLineParser(prog="x")
    add_command_arguments(parser, _Small, positional="model_dir")
    args = parse_words(parser, ["ckpt", "--prompt", "a, b", "--prompt", "c", "--chat", "inner.size=3"])
    cfg = load_command(_Small, args, "x.yaml", positional="model_dir")
    assert cfg == _Small(model_dir="ckpt", prompt=["a, b", "c"], chat=True, inner=_Inner(size=3))
    args = parse_words(parser, ["--no-chat", "--inner.size", "5", "model_dir=m"])
    assert load_command(_Small, args, "x.yaml", positional="model_dir") == _Small(model_dir="m", inner=_Inner(5))


@dataclasses.dataclass
class _Renamed:
    RENAMED = {"steps": "inner.size", "out": "where"}
    SHORT_FLAGS = {"-o": "where"}

    where: str = field("runs/x", help="output")
    inner: _Inner = field(default_factory=_Inner, help="a section")


def test_a_renamed_key_keeps_its_old_flag_hidden_with_a_deprecation_and_short_flags_work():
    parser = OneLineParser(prog="x")
    add_command_arguments(parser, _Renamed)
    assert "--steps" not in parser.format_help() and "-o VALUE, --where VALUE" not in parser.format_help()
    assert "--where VALUE, -o VALUE" in parser.format_help()
    with pytest.warns(DeprecatedKey, match="config key 'steps' is deprecated: use 'inner.size'"):
        cfg = load_command(_Renamed, parse_words(parser, ["--steps", "4", "-o", "runs/y"]), "x.yaml")
    assert cfg == _Renamed(where="runs/y", inner=_Inner(size=4))
    with pytest.warns(DeprecatedKey, match="'out' is deprecated: use 'where'"):
        assert load_command(_Renamed, parse_words(parser, ["--out", "z"]), "x.yaml").where == "z"


@dataclasses.dataclass
class _Lists:
    runs: list[str] = field(default_factory=list, help="runs")
    ts: list[float] = field(default_factory=list, help="numbers")
    opts: dict[str, Any] = field(default_factory=dict, help="a mapping")


def test_a_list_positional_takes_every_bare_word_numbers_take_commas_and_a_mapping_key_value_items(tmp_path):
    parser = OneLineParser(prog="x")
    add_command_arguments(parser, _Lists, positional="runs")
    assert parser.format_usage() == "usage: x [RUN_DIR ...] [CONFIG.yaml] [key=value ...] [--KEY VALUE ...]\n"
    args = parse_words(parser, ["a", "b", "--ts", "0.5,0.7", "--ts", "0.9", "c", "--opts", "k=1", "--opts",
                                "{j: [x, y]}", "--opts", "s=a,b"])
    cfg = load_command(_Lists, args, "x.yaml", positional="runs")
    assert cfg == _Lists(runs=["a", "b", "c"], ts=[0.5, 0.7, 0.9], opts={"k": 1, "j": ["x", "y"], "s": "a,b"})
    (tmp_path / "c.yaml").write_text("runs: [r]\nopts: {k: 0, m: 1}\n")
    args = parse_words(parser, ["a", str(tmp_path / "c.yaml"), "ts=0.1,0.2", "--opts", "k=2"])
    assert load_command(_Lists, args, "x.yaml", positional="runs") == _Lists(runs=["a"], ts=[0.1, 0.2],
                                                                             opts={"k": 2})
    with pytest.raises(SystemExit) as stop:
        parse_words(parser, ["a", "--opts", "5"])
    assert stop.value.code == 2
    with pytest.raises(ConfigError, match=r"^ts\[0\]: expected a number, got 'x'$"):
        load_command(_Lists, parse_words(parser, ["--ts", "x"]), "x.yaml", positional="runs")


def test_rl_help_lists_the_shared_sections_and_a_line_per_other_section(monkeypatch, capsys):
    """``rl --help`` printed 716 lines (every key of every section); now the words, model. and run. key by key, and
    one line per other section naming ``--help-config SECTION``, while every flag still parses."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as stop:
        main(["rl", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 120
    assert "--run.output-dir VALUE" in out and "--model.path VALUE" in out
    assert "--train.max-steps" not in out and "--rollout.gen-length" not in out
    assert re.search(r"\ntrain \(--train.KEY VALUE\):\n  \d+ keys, listed by --help-config train: optimisation loop\n",
                     out)
    assert re.search(r"\nRLConfig \(--KEY VALUE\):\n  \d+ keys, listed by --help-config: the top-level keys\n", out)
    args = parse_words(_subparser("rl"), ["--train.max-steps", "3", "--rollout.gen-length", "8"])
    assert given_flags(args) == ["train.max_steps=3", "rollout.gen_length=8"]


def test_a_bool_key_of_a_section_is_negated_after_the_section_and_the_old_spelling_still_works():
    """``--run.no-progress`` (listed by --help) rather than argparse's ``--no-run.progress``, which reads as negating
    the section; that spelling of earlier releases still parses, hidden; a top-level bool stays ``--no-key``."""
    parser = _subparser("eval")
    text = " ".join(parser.format_help().split())
    assert "--run.progress, --run.no-progress" in text and "--no-run.progress" not in text
    for argv, value in ((["--run.no-progress"], "false"), (["--no-run.progress"], "false"),
                        (["--run.progress"], "true"), (["--no-run.progress", "--run.progress"], "true")):
        assert given_flags(parse_words(parser, argv)) == [f"run.progress={value}"]
    assert negative_flags("--chat") == ("--no-chat",)
    assert negative_flags("--reward.judge.delimit") == ("--reward.judge.no-delimit", "--no-reward.judge.delimit")


def test_help_config_of_one_section(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["rl", "--help-config", "lora"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "lora: LoRA (peft) settings; full fine-tuning when off"
    assert lines[1].startswith("lora.enabled (default False): ") and all(line.startswith("lora.") for line in lines[1:])
    with pytest.raises(SystemExit) as stop:
        main(["rl", "--help-config", "lorax"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("dllm-rl rl: error: --help-config lorax: no such section (sections: "
                                              "run, model, data, reward, ")
    with pytest.raises(SystemExit) as stop:  # a word that is no section name is the command line's: every key
        main(["rl", "--help-config", "configs/x.yaml", "train.max_steps=1"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("run: ")


@dataclasses.dataclass
class _Required:
    n: int = field(help="rows")
    inner: _Inner = field(default_factory=_Inner, help="a section")


def test_a_required_key_not_given_is_named_and_an_empty_command_line_may_load_the_defaults():
    from dllm_rl.config import load_config

    with pytest.raises(ConfigError, match=r"^n: required, not given \(set n=VALUE\)$"):
        load_config(_Required, None, ["inner.size=3"])
    parser = OneLineParser(prog="x")
    add_command_arguments(parser, _Small)
    assert load_command(_Small, parse_words(parser, []), None) == _Small()


def test_demo_help_config_lists_its_own_options_then_the_rl_keys(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--help-config"])
    assert stop.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "the demo's own options (flags only):"
    assert [line.split(" (default")[0] for line in lines[1:4]] == ["kind", "recipe", "output_dir"]
    assert any(line.startswith("train.max_steps (default 20): ") for line in lines)
