from dataclasses import dataclass
from typing import Literal

import pytest

from dllm_rl.config import Checked, ConfigError, as_overrides, describe, field, load_config, save_config


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


def test_a_mapping_of_settings_as_overrides_laid_over_a_file(tmp_path):
    """as_overrides: sections are descended into, a dict or list field stays one value, strings stay bare; laid
    over a file the settings replace only the keys they name (optim.betas is kept), and later overrides win."""
    settings = {"name": "y", "options": {"k": 4, "mode": "a b"}, "band": [0.1, 0.5], "block_size": None,
                "optim": {"lr": 0.002}, "bf16": True}
    overrides = as_overrides(Run, settings)
    assert overrides == ["name=y", 'options={"k": 4, "mode": "a b"}', "band=[0.1, 0.5]", "block_size=null",
                         "optim.lr=0.002", "bf16=true"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 3\nblock_size: 8\noptim:\n  betas: [0.5, 0.6]\n")
    assert load_config(Run, cfg, [*overrides, "steps=5"]) == Run(
        name="y", steps=5, bf16=True, block_size=None, optim=Optim(lr=0.002, betas=[0.5, 0.6]),
        options={"k": 4, "mode": "a b"}, band=[0.1, 0.5])
    with pytest.raises(ConfigError, match=r"unknown key 'stpes' in config; did you mean 'steps'"):
        load_config(Run, None, as_overrides(Run, {"stpes": 3}))


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


@dataclass
class Checked_(Checked):
    mode: Literal["group", "batch", "none"] | None = field(None, help="a choice whose values include 'none'")
    rate: float = field(0.5, gt=0, le=1, help="a fraction")
    count: int = field(1, ge=1, help="at least one")
    name: str = field("a", choices=lambda: ("a", "b"), help="a registry's names, read when checked")
    pair: list[float] | None = field(None, check=lambda v: None if len(v) == 2 else "give two numbers",
                                     help="two numbers")


def test_field_metadata_is_checked_at_construction_and_load():
    assert load_config(Checked_, None, ["mode=none"]).mode == "none"  # a choice named none is not null
    assert load_config(Checked_, None, ["mode=null"]).mode is None
    for override, message in [
        ("mode=all", "mode: 'all' is not allowed; choose one of group, batch, none"),
        ("rate=0", r"rate: must be in \(0, 1\], got 0.0"),
        ("rate=1.5", r"rate: must be in \(0, 1\], got 1.5"),
        ("count=0", "count: must be >= 1, got 0"),
        ("name=c", "name: 'c' is not allowed; choose one of a, b"),
        ("pair=[1,2,3]", "pair: give two numbers"),
    ]:
        with pytest.raises(ConfigError, match=f"^{message}$"):
            load_config(Checked_, None, [override])
    with pytest.raises(ConfigError, match=r"^count: must be >= 1, got -2$"):
        Checked_(count=-2)
    assert "mode (default None): a choice whose values include 'none' (one of: group, batch, none)" in \
        describe(Checked_)


def test_nested_errors_name_the_dotted_key_and_the_file(tmp_path):
    from dllm_rl.rl.config import RLConfig

    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  cache: full\n")
    with pytest.raises(ConfigError, match=r"^.*c.yaml: rollout.cache: 'full' is not allowed; choose one of none, "
                       r"prefix, dual$"):
        load_config(RLConfig, cfg)
    with pytest.raises(ConfigError, match=r"^optim.lr: must be > 0, got 0.0$"):
        load_config(RLConfig, None, ["optim.lr=0"])


def test_sft_sections_check_their_values_when_built():
    """The SFT trainer's hand-written checks (batch_size, grad_accum, max_steps, init_std, objective.eps) are
    field declarations now: a bad value fails when the section is built, in code or from YAML."""
    from dllm_rl.sft.config import ModelConfig, SFTConfig, TrainConfig
    from dllm_rl.sft.objectives import ObjectiveConfig

    with pytest.raises(ConfigError, match=r"^grad_accum: must be >= 1, got 0$"):
        TrainConfig(grad_accum=0)
    with pytest.raises(ConfigError, match=r"^init_std: must be > 0, got 0$"):
        ModelConfig(init_std=0)
    with pytest.raises(ConfigError, match=r"^eps: must be in \(0, 1\), got 1.0$"):
        ObjectiveConfig(eps=1.0)
    with pytest.raises(ConfigError, match=r"^train.micro_batch_size: must be >= 1, got 0$"):
        load_config(SFTConfig, None, ["train.micro_batch_size=0"])
    with pytest.raises(ConfigError, match=r"^data.max_length: must be >= 1, got 0$"):
        load_config(SFTConfig, None, ["data.max_length=0"])


def test_yaml_aliases_are_bounded_before_anything_expands(tmp_path):
    """Anchors and merge keys still work; an alias bomb (~1 KB, 9**9 values expanded), a self-referential value
    and a document nested past 100 levels are refused naming the file and line, and so is a non-UTF-8 file."""
    from dllm_rl.config import YAML_MAX_NODES, yaml_load

    cfg = tmp_path / "c.yaml"
    cfg.write_text("base: &b {lr: 0.5}\noptim:\n  <<: *b\n  betas: &bs [0.1, 0.2]\nband: *bs\n")
    with pytest.raises(ConfigError, match="unknown key 'base'"):  # the anchors resolved, the extra key refused
        load_config(Run, cfg)
    assert yaml_load(cfg.read_bytes(), "c") == {"base": {"lr": 0.5}, "optim": {"lr": 0.5, "betas": [0.1, 0.2]},
                                                "band": [0.1, 0.2]}
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    assert len("\n".join(levels)) < 1100
    cfg.write_text("options:\n" + "".join(f"  {line}\n" for line in levels))
    with pytest.raises(ConfigError, match=rf"^{cfg}: line 7: its aliases \(\*name\) expand to more than 100,000 "):
        load_config(Run, cfg)
    # exactly at the bound is fine: 1 (top) + 1 (key) + 1 + 99_997 scalars = YAML_MAX_NODES nodes
    assert len(yaml_load("k: [" + ", ".join(["1"] * (YAML_MAX_NODES - 3)) + "]", "x")["k"]) == YAML_MAX_NODES - 3
    with pytest.raises(ConfigError, match="more than 100,000 values"):
        yaml_load("k: [" + ", ".join(["1"] * (YAML_MAX_NODES - 2)) + "]", "x")
    cfg.write_text("options: &o {self: *o}\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: line 1: an alias \(\*name\) refers to a value that contains it"):
        load_config(Run, cfg)
    cfg.write_text("options: " + "[" * 100 + "]" * 100 + "\n")  # the top mapping and 100 lists: 101 levels
    with pytest.raises(ConfigError, match=rf"^{cfg}: line 1: nested deeper than 100 levels"):
        load_config(Run, cfg)
    deepest = yaml_load("options: " + "[" * 99 + "]" * 99, "x")["options"]
    for _ in range(98):
        (deepest,) = deepest
    assert deepest == []
    cfg.write_bytes(b"name: x\nsteps: 3 # \xff\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: not UTF-8 text \(byte 0xff on line 2\); save the file as UTF-8$"):
        load_config(Run, cfg)
    with pytest.raises(ConfigError, match=r"^override 'optim': line 1: its aliases"):  # an override is bounded too
        load_config(Run, None, ["optim={a: &a [" + ",".join(["1"] * 50) + "], b: [" + ",".join(["*a"] * 2100) + "]}"])


def _float_keys(cls: type, prefix: str = "") -> list[str]:
    """The dotted keys of every float field of config ``cls`` and its sections (``list[float]`` included)."""
    import dataclasses
    import typing

    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        args = typing.get_args(hints[f.name]) or (hints[f.name],)
        section = next((a for a in args if dataclasses.is_dataclass(a)), None)
        if section is not None and typing.get_origin(hints[f.name]) is list:
            continue  # a list of entries (reward.terms): each entry is a Checked config, tested by its module
        if section is not None:
            keys += _float_keys(section, f"{prefix}{f.name}.")
        elif float in args or any(typing.get_args(a) == (float,) for a in args):
            keys.append(prefix + f.name)
    return keys


@pytest.mark.parametrize("value", ["inf", "-inf", "1e309", "nan"])
def test_every_float_option_of_every_config_must_be_finite(value):
    """optim.lr=inf (or 1e309) used to pass the `> 0` check and train the weights to NaN; NaN passed every
    unbounded field. Every float field of the RL, SFT and sampler configs refuses both, naming the key."""
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.sampling.config import DecodeConfig
    from dllm_rl.sft.config import SFTConfig

    checked = 0
    for cls in (RLConfig, SFTConfig, DecodeConfig):
        keys = _float_keys(cls)
        assert keys, cls
        for key in keys:
            raw = f"[0.2, {value}]" if key.endswith("accuracy_band") else value
            with pytest.raises(ConfigError, match=rf"^{key}: must be a finite number, got -?(inf|nan)$"):
                load_config(cls, None, [f"{key}={raw}"])
            checked += 1
    assert checked >= 25  # optim.lr, beta, epsilon, the value model's, SFT's, the sampler's, ...
    with pytest.raises(ConfigError, match=r"^beta: must be a finite number, got inf$"):
        RLConfig(beta=float("inf"))  # built in code, too


def test_a_config_class_annotations_are_evaluated_once(monkeypatch):
    """Loading an RL config evaluates no annotation the first load already did (once cost ~0.5 s per load)."""
    import typing

    from dllm_rl.rl.config import RLConfig

    load_config(RLConfig, None, ["model.path=m", "train.max_steps=3"])
    calls = []
    original = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: calls.append(a) or original(*a, **k))
    cfg = load_config(RLConfig, None, ["model.path=m", "train.max_steps=3"])
    assert cfg.train.max_steps == 3 and calls == []
