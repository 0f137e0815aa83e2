from dataclasses import dataclass

import pytest

from dllm_rl.config import ConfigError, describe, field, load_config, save_config


@dataclass
class Optim:
    lr: float = field(1e-5, help="learning rate")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], help="AdamW betas")


@dataclass
class Run:
    name: str = field("demo", help="run name")
    steps: int = field(10, help="number of steps")
    bf16: bool = field(False, help="use bfloat16")
    block_size: int | None = field(None, help="block size (None for full attention)")
    optim: Optim = field(default_factory=Optim, help="optimizer settings")
    options: dict | None = field(None, help="free-form options (a bare dict annotation)")
    band: list | None = field(None, help="a bare list annotation")


def test_typo_fails_with_suggestion(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stpes: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'stpes'; did you mean 'steps'"):
        load_config(Run, cfg)
    with pytest.raises(ConfigError, match=r"unknown key 'lrr' in optim; did you mean 'lr'"):
        load_config(Run, None, ["optim.lrr=1"])


def test_overrides_of_nested_fields_and_types(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: x\noptim:\n  lr: 0.001\n")
    run = load_config(Run, cfg, ["steps=7", "bf16=true", "optim.lr=3e-4", "optim.betas=[0.5,0.6]", "block_size=4"])
    assert run == Run(name="x", steps=7, bf16=True, block_size=4, optim=Optim(lr=3e-4, betas=[0.5, 0.6]))
    assert isinstance(run.steps, int) and isinstance(run.optim.lr, float) and run.bf16 is True
    assert load_config(Run, None, ["block_size=none"]).block_size is None
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(Run, None, ["steps=2.5"])
    with pytest.raises(ConfigError, match="expected true/false"):
        load_config(Run, None, ["bf16=maybe"])
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(Run, None, ["steps"])


def test_bare_dict_and_list_fields_parse_overrides():
    """`estimator_options={shrinkage: 2}` on the command line is a mapping, not the string."""
    run = load_config(Run, None, ["options={shrinkage: 2, coupled: true}", "band=[0.2, 0.8]"])
    assert run.options == {"shrinkage": 2, "coupled": True} and run.band == [0.2, 0.8]
    assert load_config(Run, None, ["options=none"]).options is None
    with pytest.raises(ConfigError, match="options: expected a mapping, got 3"):
        load_config(Run, None, ["options=3"])


def test_saved_config_reloads_equal(tmp_path):
    run = load_config(Run, None, ["steps=3", "optim.betas=[0.1,0.2]"])
    path = save_config(run, tmp_path / "resolved.yaml")
    assert load_config(Run, path) == run


def test_describe_lists_help():
    lines = describe(Run)
    assert "steps (default 10): number of steps" in lines
    assert "optim.lr (default 1e-05): learning rate" in lines


def test_every_subcommand_help_renders(capsys):
    import pytest as _pytest

    from dllm_rl.cli import build_parser

    parser = build_parser()
    names = list(parser._subparsers._group_actions[0].choices)
    assert {"info", "generate", "data", "sft", "rl", "demo", "eval", "trace", "plot"} <= set(names)
    for name in names:
        with _pytest.raises(SystemExit) as exc:
            parser.parse_args([name, "--help"])
        assert exc.value.code == 0
        assert "usage: dllm-rl " + name in capsys.readouterr().out
