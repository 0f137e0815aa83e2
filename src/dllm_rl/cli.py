"""The `dllm-rl` command line.

Each subcommand lives in the module that owns it, which exposes ``register(subparsers)``: it adds its
parser and sets ``func`` (a plain function taking the parsed namespace). This file only lists them, so a
subcommand is one module plus one line in ``SUBCOMMANDS``.

Start-up: a run imports only the module of the subcommand it names (``dllm-rl rl`` never imports the server's
or the evaluation's), and ``--version``, ``--help`` and an unknown command import none of them, nor torch: the
command list they print is :data:`SUBCOMMANDS`' one-line help (``tests/core/test_lazy_imports.py`` checks it
against what each module registers).

Errors: an exception of a type in :data:`dllm_rl.errors.USER_ERRORS` (``UserError`` and its subclasses
``ConfigError`` / ``DataError``, or a missing file) is the user's to fix: it is printed as one line
``dllm-rl COMMAND: error: MESSAGE`` and the command exits with status 2. Anything else is a bug and keeps
its traceback. Ctrl-C prints one line (a training run's names the step and how to resume) and exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from dllm_rl.errors import USER_ERRORS

# name -> (module that registers it, its line in the command list). Only subcommands that exist are listed.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "info": ("dllm_rl.models.cli", "print a checkpoint's family, attention rule, mask id, size and dtype"),
    "generate": ("dllm_rl.sampling.cli", "decode completions with a diffusion LM (optionally write the trace)"),
    "data": ("dllm_rl.tasks.cli", "make synthetic datasets, inspect tasks, check the code sandbox"),
    "sft": ("dllm_rl.sft.cli", "supervised fine-tuning (random_mask | block | trace | ar | uniform objectives)"),
    "dpo": ("dllm_rl.dpo.cli", "preference training (VRPO: DPO on stratified ELBOs, LLaDA 1.5)"),
    "pairs": ("dllm_rl.dpo.cli", "preference pairs (for dllm-rl dpo) from a model's own right and wrong answers"),
    "rl": ("dllm_rl.rl.cli", "RL post-training (presets: {presets}; --help-config prints the table)"),
    "demo": ("dllm_rl.rl.cli", "a short RL run of the shipped tiny model on CPU (accuracy before/after)"),
    "eval": ("dllm_rl.eval.cli", "evaluate a checkpoint on a task under one or more decoding settings (resumable)"),
    "trace": ("dllm_rl.eval.cli", "write a self-contained HTML page replaying a decode step by step"),
    "plot": ("dllm_rl.eval.cli", "draw one dashboard of a training run (reward, held-out accuracy, KL / clip "
             "fraction, length / NFE, time per step); several runs overlaid"),
    "serve": ("dllm_rl.serve.cli", "serve a model over HTTP (OpenAI-compatible, continuous batching)"),
}


def command_help(name: str) -> str:
    """The line of subcommand ``name`` in the command list, without importing torch (the RL presets are the file
    names of ``rl/methods``, read by :func:`dllm_rl.rl.cli.preset_names`, whose module imports no model code)."""
    text = SUBCOMMANDS[name][1]
    if "{presets}" in text:
        from dllm_rl.rl.cli import preset_names

        text = text.format(presets=preset_names())
    return text


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: a bad flag or value prints ``dllm-rl COMMAND: error: ...``
    (where to look for help included) and exits 2, as every other user error does, instead of the usage block
    before the message. Subcommand parsers are of the same class (``add_subparsers`` takes the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``dllm-rl`` parser. ``command=None``: every subcommand registered (each module imported); a subcommand's
    name: only the module that owns it; ``""``: none, the command list alone (what ``--version``, ``--help`` and an
    unknown command need, built without importing any subcommand's module)."""
    from dllm_rl import __version__

    parser = OneLineParser(
        prog="dllm-rl",
        description="Post-train diffusion language models with RL (TraceRL, ESPO, GRPO variants) and SFT.",
    )
    parser.add_argument("--version", action="version", version=f"dllm-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command == "":
        for name in SUBCOMMANDS:
            sub.add_parser(name, help=command_help(name), add_help=False)
        return parser
    modules = [SUBCOMMANDS[command][0]] if command is not None else list(dict.fromkeys(m for m, _ in
                                                                                        SUBCOMMANDS.values()))
    for module_name in modules:
        importlib.import_module(module_name).register(sub)
    return parser


def command_of(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first word that is not an option: the top level takes no option with a
    value), or ``""`` when it names none that exists."""
    first = next((word for word in argv if not word.startswith("-")), "")
    return first if first in SUBCOMMANDS else ""


def parse_words(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, where a command with config words (``add_command_arguments``: ``[CONFIG.yaml]
    [key=value ...]``) takes them before, between and after its flags: argparse fills a ``*`` positional from
    one run of words only, and leaves the words after a flag over (``rl --train.max-steps 3 beta=0``)."""
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "words", None), list) and not any(w.startswith("-") for w in extra):
        args.words += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _one_line_deprecations() -> None:
    """A renamed config key's warning as one line (``dllm-rl: warning: config key 'max_steps' is deprecated: use
    'train.max_steps' ...``) instead of Python's two-line form with a source line; other warnings keep theirs."""
    from dllm_rl.config.renames import DeprecatedKey

    plain = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if issubclass(category, DeprecatedKey):
            return f"dllm-rl: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning


def main(argv: list[str] | None = None) -> int:
    asked = list(argv) if argv is not None else sys.argv[1:]  # what was asked, for reproducibility records
    parser = build_parser(command_of(asked))  # only the named subcommand's module is imported
    args = parse_words(parser, asked)
    args.argv = asked
    _one_line_deprecations()
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except USER_ERRORS as exc:  # the user's to fix: one line, no traceback (see the module docs)
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"dllm-rl {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: one line (a run's says where it stopped), the shell's status 130
        print(f"dllm-rl {args.command}: interrupted" + (f": {exc}" if str(exc) else ""), file=sys.stderr)
        return 130
    finally:
        if "torch.distributed" in sys.modules:  # a run under accelerate launch / torchrun: leave its ranks cleanly
            from dllm_rl.training.accel import end_distributed

            end_distributed()
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
