"""The `dllm-rl` command line.

Each subcommand lives in the module that owns it, which exposes ``register(subparsers)``: it adds its
parser and sets ``func`` (a plain function taking the parsed namespace). This file only lists them, so a
subcommand is one module plus one line in ``SUBCOMMANDS``.

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

# name -> module that registers it. Only subcommands that exist are listed.
SUBCOMMANDS: dict[str, str] = {
    "info": "dllm_rl.models.cli",
    "generate": "dllm_rl.sampling.cli",
    "data": "dllm_rl.tasks.cli",
    "sft": "dllm_rl.sft.cli",
    "dpo / pairs": "dllm_rl.dpo.cli",
    "rl / demo": "dllm_rl.rl.cli",
    "eval / trace / plot": "dllm_rl.eval.cli",
    "serve": "dllm_rl.serve.cli",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: a bad flag or value prints ``dllm-rl COMMAND: error: ...``
    (where to look for help included) and exits 2, as every other user error does, instead of the usage block
    before the message. Subcommand parsers are of the same class (``add_subparsers`` takes the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from dllm_rl import __version__

    parser = OneLineParser(
        prog="dllm-rl",
        description="Post-train diffusion language models with RL (TraceRL, ESPO, GRPO variants) and SFT.",
    )
    parser.add_argument("--version", action="version", version=f"dllm-rl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    return parser


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
    _one_line_deprecations()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what was asked, for reproducibility records
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
