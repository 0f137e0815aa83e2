"""Every command on the one front end (``dllm_rl.config.command``), for the tests that check its flags
(``test_front_end.py``) and the docs' command lines (``test_docs.py``): one table, so that a converted command
added here is checked by both."""

from __future__ import annotations

import importlib

#: command (``data make``: a subcommand's own) -> (module, its config dataclass, the key its bare words set or None)
COMMANDS = {
    "rl": ("dllm_rl.rl.config", "RLConfig", None),
    "demo": ("dllm_rl.rl.config", "RLConfig", None),
    "sft": ("dllm_rl.sft.config", "SFTConfig", None),
    "dpo": ("dllm_rl.dpo.config", "DPOConfig", None),
    "eval": ("dllm_rl.eval.config", "EvalRunConfig", "model.path"),
    "trace": ("dllm_rl.eval.config", "TraceConfig", "model.path"),
    "plot": ("dllm_rl.eval.config", "PlotConfig", "runs"),
    "generate": ("dllm_rl.sampling.config", "GenerateConfig", "model.path"),
    "serve": ("dllm_rl.serve.config", "ServeConfig", "model.path"),
    "pairs": ("dllm_rl.dpo.pairs", "PairsConfig", None),
    "info": ("dllm_rl.models.cli", "InfoConfig", "model.path"),
    "data make": ("dllm_rl.tasks.data_config", "MakeDataConfig", "task"),
    "data show": ("dllm_rl.tasks.data_config", "ShowDataConfig", "task"),
    "data sandbox": ("dllm_rl.tasks.data_config", "SandboxCheckConfig", None),
}
#: command -> (module, the dataclass of its own options beside its config: ``add_option_flags``)
OPTIONS = {"demo": ("dllm_rl.rl.cli", "DemoOptions")}


def config_class(command: str) -> type:
    module, name, _ = COMMANDS[command]
    return getattr(importlib.import_module(module), name)


def options_class(command: str) -> type | None:
    if command not in OPTIONS:
        return None
    module, name = OPTIONS[command]
    return getattr(importlib.import_module(module), name)


def command_name(args) -> str:
    """The table's name of a parsed command line (``data make`` for ``dllm-rl data make ...``)."""
    sub = getattr(args, "data_command", None) if args.command == "data" else None
    return f"{args.command} {sub}" if sub else args.command
