"""`dllm-rl rl [CONFIG.yaml] [key=value ...] [--key value ...]` and `dllm-rl demo [CONFIG.yaml] [key=value ...]
[--key value ...]` (the demo's own options, :class:`DemoOptions`, beside every RL key)."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dllm_rl.config import describe, field, load_config
from dllm_rl.config.reference import help_config_argument
from dllm_rl.errors import UserError
from dllm_rl.eval.demo import DEMO_DIR


def _rl_config_lines() -> list[str]:
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.presets import preset_table

    return describe(RLConfig, defaults=RLConfig()) + [""] + preset_table()


def run_rl(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.rl.config import RLConfig
    from dllm_rl.rl.loop import train

    cfg = load_command(RLConfig, args, "configs/llada-espo-gsm8k.yaml")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    summary = train(cfg)
    if summary.get("is_main", True):
        print(json.dumps({k: v for k, v in summary.items() if k != "is_main"}, indent=2))
    return 0


def demo_config_path(model_kind: str) -> Path:
    return DEMO_DIR / f"rl-{model_kind}.yaml"


def demo_overrides(model_kind: str) -> list[str]:
    """Absolute paths of the shipped demo checkpoint and data: the demo YAML names them relative to DEMO_DIR."""
    import yaml

    data = yaml.safe_load(demo_config_path(model_kind).read_text())
    keys = (("model", "path"), ("data", "train_file"), ("eval", "data"))
    return [f"{section}.{key}={DEMO_DIR / data[section][key]}" for section, key in keys]


def recipe_overrides(model_kind: str, algorithm: str, recipe: str | None = None) -> list[str]:
    """The settings of ``algorithm``'s recipe for the ``model_kind`` demo, as overrides laid over the demo config
    (``assets/demo/recipes/KIND-ALGORITHM.yaml``, the block demo's ESPO recipe), or none when it has no recipe:
    a recipe belongs to one algorithm, so the demo's other algorithms run the demo config as it is. A named
    ``recipe`` (``dllm-rl demo --recipe NAME``) is a variant laid over that: ``KIND-ALGORITHM-NAME.yaml``, which
    must exist (the error lists the demo's named recipes)."""
    from dllm_rl.config import as_overrides, yaml_load
    from dllm_rl.rl.config import RLConfig

    folder = DEMO_DIR / "recipes"
    names = [f"{model_kind}-{algorithm}.yaml"]
    if recipe:
        named = folder / f"{model_kind}-{algorithm}-{recipe}.yaml"
        if not named.is_file():
            known = ", ".join(sorted(p.stem for p in folder.glob(f"{model_kind}-*-*.yaml"))) or "none"
            raise UserError(f"--recipe: the {model_kind} demo has no {recipe!r} recipe for {algorithm} "
                            f"({named.name}); its named recipes (MODEL-ALGORITHM-NAME): {known}")
        names.append(named.name)
    out: list[str] = []
    for path in (folder / name for name in names):
        out += as_overrides(RLConfig, yaml_load(path.read_bytes(), str(path)) or {}) if path.is_file() else []
    return out


def demo_algorithm(model_kind: str, algorithm: str | None, overrides: list[str]) -> str:
    """The algorithm a demo run resolves to: the last ``algorithm=`` override, else ``algorithm`` (the flag), else
    the demo config's. Read from the text, not a loaded config: the recipe is not laid over yet, and settings
    that only hold with it (``train.ema_start`` without the recipe's ``ema_decay``) would be refused."""
    from dllm_rl.config import yaml_load

    given = [o.split("=", 1)[1].strip() for o in overrides if o.split("=", 1)[0].strip() == "algorithm"]
    path = demo_config_path(model_kind)
    return given[-1] if given else algorithm or (yaml_load(path.read_bytes(), str(path)) or {})["algorithm"]


def demo_run_overrides(model_kind: str, algorithm: str | None, overrides: list[str],
                       recipe: str | None = None) -> tuple[str, list[str]]:
    """The algorithm a ``dllm-rl demo`` run resolves to, and every override of the run but its directory: the
    shipped files' paths, ``algorithm`` (None: the demo config's), that algorithm's recipe and the named ``recipe``
    over it, then ``overrides``, which win."""
    chosen = demo_algorithm(model_kind, algorithm, overrides)
    base = demo_overrides(model_kind) + ([f"algorithm={algorithm}"] if algorithm else [])
    return chosen, base + recipe_overrides(model_kind, chosen, recipe) + overrides


#: what the demo's report calls each model
DEMO_MODELS = {"full": "full-attention model", "block": "block-attention model", "block8": "block-attention model",
               "vision": "LLaDA-V-shaped vision model", "gemma": "DiffusionGemma-shaped model"}
#: the demo models whose held-out evaluation samples (under fixed seeds): a uniform-state sampler has no greedy mode
SAMPLED_EVAL = frozenset({"gemma"})


@dataclass
class DemoOptions:
    """The demo's own options, flags only (`dllm-rl demo --model gemma --recipe speed --output-dir runs/demo`);
    everything else on its command line is an RL key (`--algorithm tracerl`, `--train.max-steps 3`, `beta=0`, a
    YAML of RL keys) laid over the demo config and its recipes, as `dllm-rl rl` reads them."""

    FLAGS: ClassVar[dict[str, str]] = {"kind": "--model"}  # the spelling of the docs and `make demo MODEL=...`

    kind: str = field("block", choices=tuple(DEMO_MODELS), help=(
        "the demo model (flag --model): full = llada-shaped demo model, block = sdar-shaped (block 4), block8 = the "
        "sdar model adapted to decode at block 8 (TraceRL's block-size adaptation, rl-block8.yaml), vision = a "
        "llada_v-shaped model on the shapes image task (rl-vision.yaml), gemma = a diffusion_gemma-shaped "
        "(uniform-state) Countdown model (rl-gemma.yaml)"))
    recipe: str | None = field(None, help=(
        "a named recipe laid over the demo config and its algorithm's recipe: speed (a speed reward where the answer "
        "is right, threshold decoding, LightningRL's decoupled normalisation; for espo on the block model and "
        "tracerl on the full one: assets/demo/recipes/MODEL-ALGORITHM-NAME.yaml)"))
    output_dir: str = field("runs/demo", help=(
        "where the run goes (in OUTPUT_DIR/MODEL-ALGORITHM, or MODEL-ALGORITHM-RECIPE; a previous demo run there is "
        "replaced, unless run.resume=latest is given; run.output_dir names the run's own folder instead)"))


def _file_overrides(path: Path) -> list[str]:
    """The settings of the RL config file ``path`` as overrides, to be laid over another config."""
    from dllm_rl.config import ConfigError, as_overrides, yaml_load
    from dllm_rl.rl.config import RLConfig

    if not path.is_file():
        raise FileNotFoundError(f"{path}: config file not found")
    data = yaml_load(path.read_bytes(), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return as_overrides(RLConfig, data)


def demo_config(args: argparse.Namespace):
    """The :class:`DemoOptions` and the RL config of a ``dllm-rl demo`` command line: the demo config of the model,
    the shipped files' paths, the run directory (OUTPUT_DIR/MODEL-ALGORITHM[-RECIPE]), the algorithm's recipe and
    the named one, then the command line's RL settings (its YAML, overrides and flags, in that order), which win."""
    from dllm_rl.config.command import given_flags, load_options, split_words
    from dllm_rl.rl.config import RLConfig

    options = load_options(DemoOptions, args)
    path = demo_config_path(options.kind)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the demo config is missing from this installation")
    config, overrides = split_words(list(getattr(args, "words", None) or []))
    mine = (_file_overrides(Path(config)) if config else []) + overrides + given_flags(args)
    # the demo starts afresh each time (`make demo` twice reruns it), unless run.resume=... is given
    fresh = [] if any(o.startswith(("run.resume=", "run.overwrite=", "resume=", "overwrite=")) for o in mine) else [
        "run.overwrite=true"]
    # the run directory is named for the algorithm the run resolves to (the demo YAML's unless given)
    algorithm, settings = demo_run_overrides(options.kind, None, fresh + mine, options.recipe)
    name = f"{options.kind}-{algorithm}" + (f"-{options.recipe}" if options.recipe else "")
    return options, load_config(RLConfig, path, [f"run.output_dir={options.output_dir}/{name}", *settings])


def run_demo(args: argparse.Namespace) -> int:
    """RL from the shipped tiny SFT checkpoint: held-out greedy accuracy before and after."""
    from dllm_rl.rl.loop import train

    options, cfg = demo_config(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    summary = train(cfg)
    print()
    greedy = "" if options.kind in SAMPLED_EVAL else "greedy "
    print(f"demo ({cfg.algorithm} on the {DEMO_MODELS[options.kind]}): held-out {greedy}accuracy "
          f"{summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%}"
          + (f" (weight average; last live policy {summary['accuracy_after_live']:.1%})"
             if "accuracy_after_live" in summary else "")
          + f" in {summary['minutes']:.1f} min; curves in {summary['output_dir']}/dashboard.png")
    return 0


def preset_names() -> str:
    """The presets, ``a | b | ...``: the modules of ``rl/methods`` (each module's name is its method's, which the
    package checks), read from the folder so that the CLI's help builds without importing the methods."""
    folder = Path(__file__).with_name("methods")
    return " | ".join(sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"))


def register(sub) -> None:
    from dllm_rl.config.command import add_command_arguments, add_option_flags
    from dllm_rl.rl.config import RLConfig

    p = sub.add_parser("rl", help=f"RL post-training (presets: {preset_names()}; --help-config prints the table)")
    add_command_arguments(p, RLConfig, words_help="a YAML config (see configs/), then key=value overrides, e.g. "
                          "algorithm=tracerl rollout.gen_length=64; every key is also a --flag",
                          help_sections=("model", "run"))  # the method's 20-odd top-level keys: one line
    help_config_argument(p, _rl_config_lines)
    p.set_defaults(func=run_rl)

    d = sub.add_parser("demo", help="a short RL run of the shipped tiny model on CPU (accuracy before/after)")
    add_option_flags(d, DemoOptions, f"--algorithm NAME, the RL key: {preset_names()} (default: the demo config's: "
                     "espo on the block model, tracerl on the full, vision and gemma ones; the demo config's beta: 0 "
                     "applies to any of them)")
    add_command_arguments(d, RLConfig, words_help="a YAML of RL settings, then key=value overrides, laid over the demo "
                          "config and its recipes; every RL key is also a --flag", help_sections=("model", "run"))
    help_config_argument(d, lambda: ["the demo's own options (flags only):"] + describe(DemoOptions) + [""]
                         + _rl_config_lines())
    d.set_defaults(func=run_demo)
