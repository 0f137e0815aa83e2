"""`dllm-rl eval`, `dllm-rl trace` and `dllm-rl plot`.

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
import shlex
import sys
from pathlib import Path
from typing import Any

from dllm_rl.config.flags import add_config_arguments, given_values
from dllm_rl.config.reference import help_config_argument
from dllm_rl.errors import UserError

DECODE_GROUP = "decoding (base for every --setting; DecodeConfig fields)"


# ------------------------------------------------------------------------------------------------ decode flags
def add_decode_arguments(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """The sampler's decode flags, stored under ``decode_<name>`` and None when unset, so only what the
    user gave overrides the defaults."""
    from dllm_rl.sampling.cli import add_decode_arguments as add_flags

    add_flags(parser, exclude=exclude, dest_prefix="decode_", with_defaults=False, title=DECODE_GROUP)


def decode_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k.removeprefix("decode_"): v for k, v in vars(args).items() if k.startswith("decode_") and v is not None}


def _command_line(args: argparse.Namespace) -> str:
    argv = getattr(args, "argv", None)
    return " ".join(shlex.quote(a) for a in ["dllm-rl", *(argv if argv is not None else sys.argv[1:])])


def _kv_options(items: list[str] | None, flag: str) -> dict[str, Any]:
    from dllm_rl.config import yaml_load

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"{flag} {item!r} must look like key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml_load(v, f"{flag} {item!r}")
    return out


def _decode_config_lines() -> list[str]:
    from dllm_rl.config import describe
    from dllm_rl.sampling.config import DecodeConfig

    return ["decoding (one --flag per key: --gen-length, --threshold, ...):"] + describe(DecodeConfig)


def _eval_config_lines() -> list[str]:
    from dllm_rl.config import describe
    from dllm_rl.eval.harness import EvalRunConfig

    return (["evaluation (one --flag per key: --task, --limit, ...):"] + describe(EvalRunConfig) + [""]
            + _decode_config_lines())


# ------------------------------------------------------------------------------------------------ eval
def eval_command(args: argparse.Namespace) -> int:
    from dllm_rl.config import FieldError
    from dllm_rl.eval.harness import EvalRunConfig, run_eval
    from dllm_rl.eval.settings import load_settings_file, parse_setting, parse_thresholds
    from dllm_rl.training.run_config import RunConfig

    task, data, prompt_style, decode = args.task, args.data, args.prompt_style, decode_overrides(args)
    if args.demo:  # the shipped demo's held-out set and decoding (dllm_rl.eval.demo); explicit flags win
        from dllm_rl.eval.demo import demo_defaults

        demo = demo_defaults(args.model_dir, decode)
        task, data, prompt_style = task or demo["task"], data or demo["data"], prompt_style or demo["prompt_style"]
        decode = demo["decode"]
    if task is None:
        raise UserError("give the task with --task NAME (or a data file), or --demo for a shipped demo checkpoint")
    settings = []
    if args.settings_file:
        settings += load_settings_file(args.settings_file)
    settings += [parse_setting(s) for s in args.setting or []]
    thresholds = parse_thresholds(args.thresholds) if args.thresholds is not None else []
    task_options = _kv_options(args.task_option, "--task-option")
    if args.task_type:
        task_options["task_type"] = args.task_type
    model_dir = Path(args.model_dir)
    default_name = f"{model_dir.resolve().name}-{Path(task).stem}-{given_values(args, EvalRunConfig)['split']}"
    run = given_values(args, RunConfig, "run.")
    run.setdefault("output_dir", str(Path("runs") / "eval" / default_name))
    output = run["output_dir"]
    fields = {**given_values(args, EvalRunConfig), "task": task, "data": data, "prompt_style": prompt_style}
    try:  # EvalRunConfig checks its ranges; the flags are generated from its fields (and the run section's)
        cfg = EvalRunConfig(model_dir=args.model_dir, task_options=task_options, decode=decode, settings=settings,
                            thresholds=thresholds, command=_command_line(args), run=RunConfig(**run),
                            **{k: v for k, v in fields.items() if k not in ("model_dir", "command", "thresholds")})
    except FieldError as exc:
        raise UserError(f"--{exc.key.replace('_', '-')}: {exc.problem}") from None
    summary = run_eval(cfg)
    print((Path(output) / ("summary.json" if args.json else "summary.md")).read_text())
    return 0 if summary else 1


def register_eval(sub) -> None:
    from dllm_rl.eval.harness import EvalRunConfig
    from dllm_rl.training.run_config import RunConfig

    p = sub.add_parser(
        "eval", help="evaluate a checkpoint on a task under one or more decoding settings (resumable)",
        description="Decode a task's items, score them and write items/<setting>.jsonl, summary.json, summary.md "
        "and accuracy_vs_nfe.png to --output. Re-running the same command resumes an interrupted evaluation.",
        epilog="example: dllm-rl eval ckpt --task countdown --limit 500 --setting static1:tokens_per_step=1 "
        "--setting static2:tokens_per_step=2 --setting dyn:threshold=0.9 -o runs/eval/countdown",
    )
    p.add_argument("model_dir", help="checkpoint directory (config.json + safetensors + tokenizer) "
                   "or a hub id org/name[@revision]")
    p.add_argument("--demo", action="store_true",
                   help="evaluate a shipped demo checkpoint as `make demo` reports it: the held-out countdown file, "
                   "compact prompts, greedy one token per step, its RL config's gen_length/block_length "
                   "(explicit flags win)")
    p.add_argument("--task-type", default=None, help="which task a data file given as --task holds (e.g. countdown)")
    p.add_argument("--setting", action="append", metavar="NAME[:KEY=VAL,...]",
                   help="a named decoding setting over the base flags, repeatable: e.g. static1:tokens_per_step=1, "
                   "dyn:threshold=0.9, b8:block_length=8,cache=prefix. Keys: DecodeConfig fields or tokens_per_step")
    p.add_argument("--thresholds", default=None, metavar="T1,T2,...",
                   help="an accuracy-vs-passes curve: one setting per confidence threshold (thr0.5, thr0.9, ...) "
                   "and thr1, one token per step, the reference each point is compared with (in summary.md's "
                   "curve table, summary.json's curve and the plot); e.g. --thresholds 0.5,0.7,0.9")
    p.add_argument("--settings-file", default=None,
                   help="YAML file of settings: {name: {key: value}} or a list of {name: ..., key: value}")
    p.add_argument("--task-option", action="append", metavar="KEY=VALUE", help="extra get_task option, repeatable")
    # one flag per EvalRunConfig field (--task, --limit, --num-samples, ...) and per run-section field it uses
    add_config_arguments(p, EvalRunConfig, exclude=("model_dir", "command"), title="evaluation (EvalRunConfig)")
    add_config_arguments(p, RunConfig, title="run (the run section shared with rl and sft)", dest_prefix="run.",
                         exclude=("resume", "save_every", "keep_checkpoints", "push_to_hub", "report_to",
                                  "distributed_timeout_s"),
                         aliases={"output_dir": ("-o", "--output")}, with_defaults=False,
                         defaults=RunConfig(output_dir="runs/eval/MODEL-TASK-SPLIT"))
    p.add_argument("--json", action="store_true", help="print summary.json instead of the Markdown table")
    # per-sample seeds derive from --seed; --block-size above also checks the model and is recorded in meta.json
    add_decode_arguments(p, exclude=("seed", "block_size"))
    help_config_argument(p, _eval_config_lines)
    p.set_defaults(func=eval_command)


# ------------------------------------------------------------------------------------------------ trace
def trace_command(args: argparse.Namespace) -> int:
    from dllm_rl.eval.trace_viewer import load_trace_jsonl, write_html

    if not args.output:
        raise UserError("give the output file with -o trace.html")
    tok_dir = args.tokenizer or args.model_dir
    if args.data and not args.task:
        raise UserError("--data FILE names the data of --task NAME: give --task too")
    if args.from_trace and (args.image or args.data or args.prompt or args.task):
        raise UserError("--from-trace draws a recorded trace: --prompt, --task, --data and --image decode anew; "
                        "give one or the other")
    if args.from_trace:
        tok = None
        if tok_dir:
            from dllm_rl.models import load_tokenizer

            tok = load_tokenizer(tok_dir)
        records = load_trace_jsonl(args.from_trace, tokenizer=tok)
        meta = {"source": args.from_trace}
    else:
        if not args.model_dir:
            raise UserError("give MODEL_DIR (to decode --prompt) or --from-trace FILE.jsonl")
        if not args.prompt and not args.task:
            raise UserError("give --prompt TEXT (repeatable) or --task NAME [--index I] to pick what to decode")
        records, meta = _decode_for_trace(args, tok_dir)
    path = write_html(args.output, records, title=args.title or "dllm-rl decoding trace", meta=meta)
    print(f"wrote {path} ({len(records)} sequence{'s' if len(records) != 1 else ''})")
    if args.screenshot:
        from dllm_rl.eval.trace_viewer.browser import screenshot_file

        shot = screenshot_file(path, args.screenshot, step=args.screenshot_step)
        print(f"wrote {shot}")
    return 0


def _decode_for_trace(args: argparse.Namespace, tok_dir: str):
    from dllm_rl.eval.settings import Setting, resolve_decode
    from dllm_rl.eval.trace_viewer import records_from_rollout
    from dllm_rl.hub import resolve_model_path
    from dllm_rl.models import load_model
    from dllm_rl.models.checks import check_model_tokenizer
    from dllm_rl.sampling import generate
    from dllm_rl.threads import use_cpu_threads
    from dllm_rl.training.accel import resolve_device, resolve_eval_dtype

    model_dir = resolve_model_path(args.model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    tok, fam, block_size = check_model_tokenizer(model_dir, resolve_model_path(tok_dir))
    resolved = resolve_decode(decode_overrides(args), Setting("trace"), block_size)
    decode = resolved.decode
    texts, labels, examples, images, task = [], [], [], [], None
    if args.task:
        from dllm_rl.tasks import get_task

        kw: dict[str, Any] = {"split": args.split}
        if args.prompt_style:
            kw["prompt_style"] = args.prompt_style
        if args.data:
            data = Path(args.data).expanduser()
            if not data.exists():
                raise FileNotFoundError(f"--data {args.data} does not exist")
            kw["data"] = str(data)
        task = get_task(args.task, **kw)
        exs = task.load()
        for i in args.index or [0]:
            if not 0 <= i < len(exs):
                raise UserError(f"--index {i} out of range: task {args.task!r} has {len(exs)} items")
            examples.append(exs[i])
            texts.append(task.build_prompt(exs[i], tok))
            labels.append(f"{args.task} item {i}")
            images.append(task.images(exs[i]) if hasattr(task, "images") else [])
    for i, p in enumerate(args.prompt or []):
        texts.append(p)
        labels.append(f"prompt {i}")
    from dllm_rl.models.image_inputs import refuse_images, takes_images

    if args.image:
        refuse_images(fam.name, "--image was given")
    images += _prompt_images(args.prompt or [], args.image or []) if takes_images(fam.name) else \
        [[] for _ in args.prompt or []]
    if any(images):
        refuse_images(fam.name, "the trace's prompts carry images")
    device = resolve_device(args.device, "--device")
    dtype = resolve_eval_dtype(args.dtype, device)
    model = load_model(model_dir, dtype=dtype, device=device)
    use_cpu_threads(device)
    from dllm_rl.models.image_inputs import PromptEncoder, image_spans

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
    p = sub.add_parser(
        "trace", help="write a self-contained HTML page replaying a decode step by step",
        description="Decode --prompt (or --task items) with MODEL_DIR, or read a `dllm-rl generate --trace` "
        "file, and write one HTML file (no network resources) with a step slider, play button and "
        "step/confidence on hover.",
    )
    p.add_argument("model_dir", nargs="?", default=None, help="checkpoint directory or hub id "
                   "(not needed with --from-trace "
                   "when the trace holds token strings)")
    p.add_argument("--prompt", action="append", help="prompt text to decode (repeatable); used as is")
    p.add_argument("--task", default=None, help="decode items of this task instead (prompt built by the task)")
    p.add_argument("--index", type=int, action="append", help="item index of --task (repeatable; default 0)")
    p.add_argument("--data", default=None, metavar="FILE", help="data file of --task instead of its default file "
                   "(an image task's relative image paths are read from the file's folder)")
    p.add_argument("--image", action="append", metavar="FILE", help="image file for the --prompt texts' <image> "
                   "placeholders, in order (repeatable; LLaDA-V and MMaDA); the page draws it where it stands")
    p.add_argument("--split", default="test", help="split of --task (default test)")
    p.add_argument("--prompt-style", default=None, help="chat | plain | compact for --task")
    p.add_argument("--from-trace", default=None, metavar="FILE.jsonl", help="a trace file from `dllm-rl generate "
                   "--trace` instead of decoding")
    p.add_argument("-o", "--output", required=True, help="HTML file to write")
    p.add_argument("--title", default=None, help="page title")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: MODEL_DIR)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--screenshot", default=None, metavar="PNG", help="also save a PNG taken in headless Chromium")
    p.add_argument("--screenshot-step", type=int, default=None, help="slider step for --screenshot (default: start)")
    add_decode_arguments(p)
    help_config_argument(p, _decode_config_lines)
    p.set_defaults(func=trace_command)


# ------------------------------------------------------------------------------------------------ plot
def plot_command(args: argparse.Namespace) -> int:
    from dllm_rl.training import plot_metrics, write_dashboard

    if args.keys and not args.per_metric:
        raise UserError("--keys selects per-metric PNGs: add --per-metric")
    print(write_dashboard(args.run_dir, out=args.output))
    if args.per_metric:
        for run_dir in args.run_dir:
            for p in plot_metrics(run_dir, keys=args.keys):
                print(p)
    return 0


def register_plot(sub) -> None:
    p = sub.add_parser("plot", help="draw one dashboard of a training run (reward, held-out accuracy, KL / clip "
                       "fraction, length / NFE, time per step); several runs overlaid",
                       description="Reads RUN_DIR/metrics.jsonl and writes RUN_DIR/dashboard.png (several runs: "
                       "one page, -o FILE.png); --per-metric also writes RUN_DIR/plots/<metric>.png.")
    p.add_argument("run_dir", nargs="+", help="run directories holding metrics.jsonl (several: overlaid)")
    p.add_argument("-o", "--output", default=None, help="dashboard image FILE.png (or .pdf, .svg), or an existing "
                   "directory, which gets dashboard.png (default RUN_DIR/dashboard.png; needed for several runs)")
    p.add_argument("--per-metric", action="store_true", help="also write one PNG per metric into RUN_DIR/plots")
    p.add_argument("--keys", nargs="+", default=None, help="with --per-metric: metrics to plot (default: all)")
    p.set_defaults(func=plot_command)


def register(sub) -> None:
    """Register ``eval``, ``trace`` and ``plot`` (those not registered yet, so listing this module under
    several names in ``SUBCOMMANDS`` is harmless)."""
    for name, fn in (("eval", register_eval), ("trace", register_trace), ("plot", register_plot)):
        if name not in sub.choices:
            fn(sub)
