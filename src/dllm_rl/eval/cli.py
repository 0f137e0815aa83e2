"""`dllm-rl eval`, `dllm-rl trace` and `dllm-rl plot`, on the one command front end
(:mod:`dllm_rl.config.command`; their config dataclasses are in :mod:`dllm_rl.eval.config`).

- ``dllm-rl eval MODEL_DIR --task countdown --limit 500 --setting static1:tokens_per_step=1
  --setting dyn:threshold=0.9 -o runs/eval/cd`` evaluates one checkpoint under several decoding
  settings (a comparison table and an accuracy-vs-NFE plot); re-running the same command resumes.
- ``dllm-rl trace MODEL_DIR --prompt TEXT -o trace.html`` (or ``--from-trace FILE.jsonl``) writes the
  step-by-step decoding viewer.
- ``dllm-rl plot RUN_DIR [RUN_DIR ...]`` draws one dashboard of a run's curves, runs overlaid
  (``metrics.jsonl`` -> ``dashboard.png``; ``--per-metric``: ``plots/*.png`` too).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from dllm_rl.errors import UserError

EVAL_EXAMPLE = "configs/eval-sdar-demo.yaml, or MODEL_DIR --task NAME"


def _command_line(args: argparse.Namespace) -> str:
    argv = getattr(args, "argv", None)
    return " ".join(shlex.quote(a) for a in ["dllm-rl", *(argv if argv is not None else sys.argv[1:])])


def _register(sub, name: str, cls: type, *, positional: str | None, words_help: str, func, **parser_kw) -> None:
    """A command on the front end: its words and one flag per key of ``cls``, and ``--help-config``."""
    from dllm_rl.config import describe
    from dllm_rl.config.command import add_command_arguments
    from dllm_rl.config.reference import help_config_argument

    p = sub.add_parser(name, **parser_kw)
    add_command_arguments(p, cls, positional=positional, words_help=words_help)
    help_config_argument(p, lambda: describe(cls, defaults=cls()))
    p.set_defaults(func=func)


# ------------------------------------------------------------------------------------------------ eval
def eval_command(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.eval.config import EvalRunConfig
    from dllm_rl.eval.harness import run_eval

    cfg = load_command(EvalRunConfig, args, EVAL_EXAMPLE, positional="model.path")
    cfg = dataclasses.replace(cfg, command=_command_line(args)).resolved()
    summary = run_eval(cfg)
    print((Path(cfg.run.output_dir) / ("summary.json" if cfg.json else "summary.md")).read_text())
    return 0 if summary else 1


def register_eval(sub) -> None:
    from dllm_rl.eval.config import EvalRunConfig

    _register(
        sub, "eval", EvalRunConfig, positional="model.path", func=eval_command,
        words_help="the checkpoint (model.path), a YAML config (see configs/eval-sdar-demo.yaml), then key=value "
        "overrides; every key is also a --flag",
        help="evaluate a checkpoint on a task under one or more decoding settings (resumable)",
        description="Decode a task's items, score them and write items/<setting>.jsonl, summary.json, summary.md "
        "and accuracy_vs_nfe.png to run.output_dir (-o). Re-running the same command resumes an interrupted "
        "evaluation.",
        epilog="example: dllm-rl eval ckpt --task countdown --limit 500 --setting static1:tokens_per_step=1 "
        "--setting static2:tokens_per_step=2 --setting dyn:threshold=0.9 -o runs/eval/countdown")


# ------------------------------------------------------------------------------------------------ trace
def trace_command(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.eval.config import TraceConfig
    from dllm_rl.eval.trace_viewer import load_trace_jsonl, write_html

    cfg = load_command(TraceConfig, args, "MODEL_DIR --prompt TEXT -o trace.html", positional="model.path")
    if not cfg.output:
        raise UserError("give the output file with -o trace.html")
    tok_dir = cfg.model.tokenizer or cfg.model.path
    if cfg.data and not cfg.task:
        raise UserError("--data FILE names the data of --task NAME: give --task too")
    if cfg.from_trace and (cfg.image or cfg.data or cfg.prompt or cfg.task):
        raise UserError("--from-trace draws a recorded trace: --prompt, --task, --data and --image decode anew; "
                        "give one or the other")
    if cfg.from_trace:
        tok = None
        if tok_dir:
            from dllm_rl.models import load_tokenizer

            tok = load_tokenizer(tok_dir)
        records = load_trace_jsonl(cfg.from_trace, tokenizer=tok)
        meta = {"source": cfg.from_trace}
    else:
        if not cfg.model.path:
            raise UserError("give MODEL_DIR (to decode --prompt) or --from-trace FILE.jsonl")
        if not cfg.prompt and not cfg.task:
            raise UserError("give --prompt TEXT (repeatable) or --task NAME [--index I] to pick what to decode")
        records, meta = _decode_for_trace(cfg, tok_dir)
    path = write_html(cfg.output, records, title=cfg.title or "dllm-rl decoding trace", meta=meta)
    print(f"wrote {path} ({len(records)} sequence{'s' if len(records) != 1 else ''})")
    if cfg.screenshot:
        from dllm_rl.eval.trace_viewer.browser import screenshot_file

        shot = screenshot_file(path, cfg.screenshot, step=cfg.screenshot_step)
        print(f"wrote {shot}")
    return 0


def _task_prompts(cfg, tok) -> tuple[Any, list[dict], list[str], list[str], list[list[Any]]]:
    """``(task, examples, prompt texts, labels, images)`` of the ``--task`` items ``cfg.index`` (default item 0)."""
    from dllm_rl.tasks import get_task

    kw: dict[str, Any] = {"split": cfg.split}
    if cfg.prompt_style:
        kw["prompt_style"] = cfg.prompt_style
    if cfg.data:
        data = Path(cfg.data).expanduser()
        if not data.exists():
            raise FileNotFoundError(f"--data {cfg.data} does not exist")
        kw["data"] = str(data)
    task = get_task(cfg.task, **kw)
    exs = task.load()
    examples, texts, labels, images = [], [], [], []
    for i in cfg.index or [0]:
        if not 0 <= i < len(exs):
            raise UserError(f"--index {i} out of range: task {cfg.task!r} has {len(exs)} items")
        examples.append(exs[i])
        texts.append(task.build_prompt(exs[i], tok))
        labels.append(f"{cfg.task} item {i}")
        images.append(task.images(exs[i]) if hasattr(task, "images") else [])
    return task, examples, texts, labels, images


def _decode_for_trace(cfg, tok_dir: str):
    from dllm_rl.config import to_dict
    from dllm_rl.eval.settings import Setting, resolve_decode
    from dllm_rl.eval.trace_viewer import records_from_rollout
    from dllm_rl.hub import resolve_model_path
    from dllm_rl.models import load_model
    from dllm_rl.models.checks import check_model_tokenizer
    from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
    from dllm_rl.models.image_inputs import PromptEncoder, image_spans, refuse_images, takes_images
    from dllm_rl.sampling import generate
    from dllm_rl.threads import use_cpu_threads

    model_dir = resolve_model_path(cfg.model.path)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    tok, fam, block_size = check_model_tokenizer(model_dir, resolve_model_path(tok_dir))
    resolved = resolve_decode(to_dict(cfg.decode), Setting("trace"), block_size)
    decode = resolved.decode
    task, examples, texts, labels, images = _task_prompts(cfg, tok) if cfg.task else (None, [], [], [], [])
    texts += cfg.prompt
    labels += [f"prompt {i}" for i in range(len(cfg.prompt))]
    if cfg.image:
        refuse_images(fam.name, "--image was given")
    images += _prompt_images(cfg.prompt, cfg.image) if takes_images(fam.name) else [[] for _ in cfg.prompt]
    if any(images):
        refuse_images(fam.name, "the trace's prompts carry images")
    device = resolve_device(cfg.model.device, "model.device")
    dtype = resolve_eval_dtype(cfg.model.dtype, device)
    model = load_model(model_dir, dtype=dtype, device=device)
    use_cpu_threads(device)
    ids, pim = PromptEncoder(tok, model_dir).encode(model, texts, images if any(images) else None)
    roll = generate(model, ids, decode, tokenizer=tok, block_cache=resolved.block_cache, images=pim)
    records = records_from_rollout(roll, tok, labels=labels, block_length=roll.block_size or decode.block_length,
                                   block_offsets=[len(x) for x in ids] if roll.block_size else None,
                                   images=images if any(images) else None,
                                   image_spans=image_spans(model, ids, pim) if any(images) else None)
    if task is not None:
        for rec, sc in zip(records, task.score_examples(roll.texts[: len(examples)], examples)):
            rec.reward = float(sc)
    meta = {"model": str(model_dir), "family": fam.name, **resolved.as_dict()}
    return records, meta


def _prompt_images(prompts: list[str], paths: list[str]) -> list[list[Any]]:
    """The ``--image`` files as PIL images, handed to the ``--prompt`` texts' ``<image>`` placeholders in order
    (:func:`~dllm_rl.tasks.images.placeholder_images`); a count that does not match is one line."""
    from dllm_rl.tasks.images import placeholder_images

    return placeholder_images(prompts, paths, place=False)[1]  # the page shows each prompt as given


def register_trace(sub) -> None:
    from dllm_rl.eval.config import TraceConfig

    _register(
        sub, "trace", TraceConfig, positional="model.path", func=trace_command,
        words_help="the checkpoint (model.path; not needed with --from-trace when the trace holds token strings), "
        "a YAML config, then key=value overrides; every key is also a --flag",
        help="write a self-contained HTML page replaying a decode step by step",
        description="Decode --prompt (or --task items) with MODEL_DIR, or read a `dllm-rl generate --trace` "
        "file, and write one HTML file (no network resources) with a step slider, play button and "
        "step/confidence on hover.")


# ------------------------------------------------------------------------------------------------ plot
def plot_command(args: argparse.Namespace) -> int:
    from dllm_rl.config.command import load_command
    from dllm_rl.eval.config import PlotConfig
    from dllm_rl.training import plot_metrics, write_dashboard

    cfg = load_command(PlotConfig, args, "RUN_DIR [RUN_DIR ...]", positional="runs")
    if not cfg.runs:
        raise UserError("give the run directories: dllm-rl plot RUN_DIR [RUN_DIR ...]")
    if cfg.keys and not cfg.per_metric:
        raise UserError("--keys selects per-metric PNGs: add --per-metric")
    print(write_dashboard(cfg.runs, out=cfg.output))
    if cfg.per_metric:
        for run_dir in cfg.runs:
            for p in plot_metrics(run_dir, keys=cfg.keys or None):
                print(p)
    return 0


def register_plot(sub) -> None:
    from dllm_rl.eval.config import PlotConfig

    _register(
        sub, "plot", PlotConfig, positional="runs", func=plot_command,
        words_help="the run directories (runs), a YAML config, then key=value overrides; every key is also a --flag",
        help="draw one dashboard of a training run (reward, held-out accuracy, KL / clip fraction, length / NFE, "
        "time per step); several runs overlaid",
        description="Reads RUN_DIR/metrics.jsonl and writes RUN_DIR/dashboard.png (several runs: one page, "
        "-o FILE.png); --per-metric also writes RUN_DIR/plots/<metric>.png.")


def register(sub) -> None:
    """Register ``eval``, ``trace`` and ``plot`` (those not registered yet, so listing this module under
    several names in ``SUBCOMMANDS`` is harmless)."""
    for name, fn in (("eval", register_eval), ("trace", register_trace), ("plot", register_plot)):
        if name not in sub.choices:
            fn(sub)
