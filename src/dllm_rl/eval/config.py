"""The configurations of ``dllm-rl eval``, ``trace`` and ``plot``: one dataclass each, whose keys are the command's
YAML keys, ``key=value`` overrides and ``--key value`` flags (``dllm-rl eval MODEL_DIR [CONFIG.yaml] [key=value
...]``). :class:`EvalRunConfig` has the shared ``model:``, ``decode:`` and ``run:`` sections, the task's keys and
the settings to compare; :class:`TraceConfig` the model, what to decode and the page; :class:`PlotConfig` the runs
to draw. The keys of the hand-written command lines of earlier releases (``--gen-length``, ``--tokenizer``,
``--seed``, ``--output``, ``--task-option``, ...) are read with a one-line deprecation naming the new key
(``RENAMED``).

:meth:`EvalRunConfig.resolved` fills in what depends on other keys: ``demo``'s task, data and decoding, ``task_type``
(a ``task_options`` entry) and the default output directory, ``runs/eval/MODEL-TASK-SPLIT``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dllm_rl.config import Checked, ConfigError, FieldError, field, from_dict, to_dict
from dllm_rl.config.vocabulary import ModelSection
from dllm_rl.errors import UserError
from dllm_rl.sampling.config import DECODING_HELP, DECODINGS, DecodeConfig
from dllm_rl.training.run_config import RunConfig

#: ``run.output_dir`` left unset: :meth:`EvalRunConfig.resolved` names the directory after the model, task and split
DEFAULT_OUTPUT = "runs/eval/MODEL-TASK-SPLIT"
#: the model keys of the earlier hand-written command lines (``--tokenizer``), now ``model.*``
_MODEL_FLAGS = {"model_dir": "model.path", "tokenizer": "model.tokenizer", "dtype": "model.dtype",
                "device": "model.device"}
#: the decode keys of the earlier hand-written command lines (``--gen-length``), now ``decode.*``
_DECODE_FLAGS = {f.name: f"decode.{f.name}" for f in dataclasses.fields(DecodeConfig)}


@dataclass
class EvalRunConfig(Checked):
    """One ``dllm-rl eval`` call (its ranges checked at construction, so a bad key fails before any loading)."""

    RENAMED: ClassVar[dict[str, str]] = {  # eval's sampler seed was no flag: --seed is the run's
        **_MODEL_FLAGS, **_DECODE_FLAGS, "output_dir": "run.output_dir", "output": "run.output_dir",
        "seed": "run.seed", "overwrite": "run.overwrite", "progress": "run.progress", "task_option": "task_options"}
    SHORT_FLAGS: ClassVar[dict[str, str]] = {"-o": "run.output_dir"}

    model: ModelSection = field(
        default_factory=ModelSection,
        help="the checkpoint evaluated (path: a directory in the published layout or a hub id; also the first bare "
        "word, `dllm-rl eval MODEL_DIR`), its tokenizer, dtype and device")
    task: str | None = field(None, help="gsm8k | math | countdown | sudoku | code | a local data file "
                             "(.jsonl/.csv/...); required unless demo")
    task_type: str | None = field(None, help="which task a data file given as task holds (e.g. countdown)")
    split: str = field("test", help="Data split of the task's default files.")
    data: str | None = field(None, help="Data file to use instead of the task's default file for `split`.")
    limit: int | None = field(None, ge=1, help="Evaluate only the first N items (the same N items every time).")
    num_samples: int = field(1, ge=1, help="Samples per item (k of pass@k); needs temperature > 0 to differ.")
    batch_size: int = field(16, ge=1, help="Sequences decoded together (results do not depend on it).")
    slots: int | None = field(
        None, ge=1, help="Decode each batch with the continuous-batching engine, this many sequences at a time (a "
        "finished one replaced at once by the next); batch_size then counts the samples written together. Results do "
        "not depend on it.")
    threads: int | None = field(None, ge=1, help="torch CPU threads on a CPU device (default: OMP_NUM_THREADS if "
                                "set, else the cores that are free when it starts).")
    prompt_style: str | None = field(None, help="Task prompt style: chat | plain | compact (default: the task's).")
    system_prompt: str | None = field(None, help="Optional system prompt for the chat template.")
    task_options: dict[str, Any] = field(
        default_factory=dict, help="Extra keyword arguments for get_task (a flag takes KEY=VALUE, repeatable).")
    demo: bool = field(
        False, help="evaluate a shipped demo checkpoint as `make demo` reports it: the held-out countdown file, "
        "compact prompts, greedy one token per step, its RL config's gen_length/block_length (keys given win; a "
        "decode key left at its default is the demo's)")
    decode: DecodeConfig = field(
        default_factory=DecodeConfig,
        help="the base decoding of every setting (decode.block_size: a block model decodes in blocks of this size, "
        "recorded in meta.json; decode.seed is unused: sample s of item i decodes with a seed derived from "
        "run.seed)")
    setting: list[str] = field(
        default_factory=list, help="named decoding settings over the base decoding, NAME[:KEY=VAL,...], "
        "repeatable: e.g. static1:tokens_per_step=1, dyn:threshold=0.9, b8:block_length=8,cache=prefix. Keys: "
        "DecodeConfig fields, tokens_per_step, block_cache or decoding (default: one, 'default')")
    settings_file: str | None = field(
        None, help="YAML file of settings, before those of `setting`: {name: {key: value}} or a list of "
        "{name: ..., key: value}")
    thresholds: list[float] = field(
        default_factory=list, help="An accuracy-vs-passes curve: one setting per confidence threshold in (0, 1] "
        "(named thr<t>), 1.0 (one token per step, the reference) added when not listed; the report gives each "
        "point's accuracy, forward passes per answer and tokens per forward against the reference (in summary.md's "
        "curve table, summary.json's curve and the plot); e.g. --thresholds 0.5,0.7,0.9.")
    decoding: str = field(
        "config", choices=DECODINGS,
        help=f"{DECODING_HELP}. Every setting's (a setting may set its own, NAME:decoding=learned); the thresholds "
        "curve's points keep their fixed thresholds, and with decoding=learned the base decoding, 'default', is "
        "evaluated beside them. Each item's threshold is in its records (threshold) and the setting's mean in the "
        "summary (threshold_mean).")
    trace_items: int = field(0, ge=0, help="Write an HTML decoding trace of the first N items per setting.")
    json: bool = field(False, help="print summary.json instead of the Markdown table")
    command: str | None = field(None, help="The command line, recorded in the metadata.")
    run: RunConfig = field(
        default_factory=lambda: RunConfig(output_dir=DEFAULT_OUTPUT),
        help="the shared run section: output_dir (-o; an existing directory of the same evaluation is resumed: "
        "evaluation always continues what is there), seed (sample s of item i uses its own seed derived from "
        "(seed, i, s)), overwrite (delete earlier results instead of resuming), progress")

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [t for t in self.thresholds if not 0 < float(t) <= 1]
        if bad:
            raise FieldError("thresholds", f"{bad[0]:g} is outside (0, 1]; a confidence threshold is a probability")
        given = [f"run.{k}" for k, v in (("resume", self.run.resume not in (None, "auto", "latest")),
                                           ("push_to_hub", self.run.push_to_hub), ("report_to", self.run.report_to),
                                           ("save_every", self.run.save_every)) if v]
        if given:
            raise ConfigError(f"{', '.join(given)}: not used by an evaluation (it writes results, not checkpoints, "
                              "and continues the results in run.output_dir); leave them unset")
        if self.decode.seed != 0:
            raise FieldError("decode.seed", "unused by an evaluation: sample s of item i decodes with a seed "
                             "derived from (run.seed, i, s); set run.seed")

    def resolved(self) -> EvalRunConfig:
        """This config with what depends on other keys filled in: ``demo``'s task, data, prompt style and decoding
        (:func:`dllm_rl.eval.demo.demo_defaults`; keys given win), ``task_type`` as a ``task_options`` entry, and
        ``run.output_dir`` left unset named ``runs/eval/MODEL-TASK-SPLIT``. Idempotent."""
        if not self.model.path:
            raise UserError("give the checkpoint: dllm-rl eval MODEL_DIR (or model.path=DIR)")
        task, data, prompt_style, decode = self.task, self.data, self.prompt_style, self.decode
        if self.demo:  # the shipped demo's held-out set and decoding (dllm_rl.eval.demo); keys given win
            from dllm_rl.eval.demo import demo_defaults

            defaults = to_dict(DecodeConfig())
            given = {k: v for k, v in to_dict(decode).items() if v != defaults[k]}
            demo = demo_defaults(self.model.path, given)
            task, data, prompt_style = task or demo["task"], data or demo["data"], prompt_style or demo["prompt_style"]
            decode = from_dict(DecodeConfig, {**to_dict(decode), **demo["decode"]}, "decode")
        if task is None:
            raise UserError("give the task with --task NAME (or a data file), or --demo for a shipped demo checkpoint")
        options = {**self.task_options, **({"task_type": self.task_type} if self.task_type else {})}
        run = self.run
        if run.output_dir == DEFAULT_OUTPUT:
            name = f"{Path(self.model.path).resolve().name}-{Path(task).stem}-{self.split}"
            run = dataclasses.replace(run, output_dir=str(Path("runs") / "eval" / name))
        return dataclasses.replace(self, task=task, data=data, prompt_style=prompt_style, decode=decode,
                                   task_options=options, run=run, demo=False)


@dataclass
class TraceConfig(Checked):
    """One ``dllm-rl trace`` call: decode ``prompt`` texts (or ``task`` items) with the model, or read a recorded
    trace (``from_trace``), and write one self-contained HTML page replaying the decode step by step."""

    RENAMED: ClassVar[dict[str, str]] = {**_MODEL_FLAGS, **_DECODE_FLAGS}
    SHORT_FLAGS: ClassVar[dict[str, str]] = {"-o": "output"}

    model: ModelSection = field(
        default_factory=ModelSection,
        help="the checkpoint that decodes (path: also the first bare word, `dllm-rl trace MODEL_DIR`; not needed "
        "with from_trace when the trace holds token strings; its tokenizer then reads token ids)")
    prompt: list[str] = field(default_factory=list, help="prompt text to decode (repeatable); used as is")
    task: str | None = field(None, help="decode items of this task instead (prompt built by the task)")
    index: list[int] = field(default_factory=list, help="item indices of task (repeatable or 0,2; default 0)")
    data: str | None = field(None, help="data file of task instead of its default file (an image task's relative "
                             "image paths are read from the file's folder)")
    image: list[str] = field(default_factory=list, help="image files for the prompt texts' <image> placeholders, "
                             "in order (repeatable; LLaDA-V and MMaDA); the page draws each where it stands")
    split: str = field("test", help="split of task")
    prompt_style: str | None = field(None, help="chat | plain | compact for task (default: the task's)")
    from_trace: str | None = field(None, help="a trace file (FILE.jsonl) from `dllm-rl generate --trace` to draw "
                                   "instead of decoding")
    output: str = field("", help="the HTML file to write (-o; required)")
    title: str | None = field(None, help="page title (default: dllm-rl decoding trace)")
    screenshot: str | None = field(None, help="also save a PNG of the page taken in headless Chromium")
    screenshot_step: int | None = field(None, ge=0, help="slider step of the screenshot (default: the start)")
    decode: DecodeConfig = field(default_factory=DecodeConfig, help="the decoding (the sampler's keys)")


@dataclass
class PlotConfig(Checked):
    """One ``dllm-rl plot`` call: one dashboard of runs' curves (``RUN_DIR/metrics.jsonl``), several runs overlaid."""

    SHORT_FLAGS: ClassVar[dict[str, str]] = {"-o": "output"}

    runs: list[str] = field(default_factory=list, help="run directories holding metrics.jsonl (several: overlaid); "
                            "the bare words, `dllm-rl plot RUN_DIR [RUN_DIR ...]`")
    output: str | None = field(None, help="dashboard image FILE.png (or .pdf, .svg), or an existing directory, which "
                               "gets dashboard.png (-o; default RUN_DIR/dashboard.png; needed for several runs)")
    per_metric: bool = field(False, help="also write one PNG per metric into RUN_DIR/plots")
    # several values at once, as before the front end (``--keys reward accuracy``): dllm_rl.config.command's "several"
    keys: list[str] = dataclasses.field(default_factory=list, metadata={"several": True, "help": (
        "with per_metric: metrics to plot (--keys reward accuracy, or repeated; default: all)")})


__all__ = ["DEFAULT_OUTPUT", "EvalRunConfig", "PlotConfig", "TraceConfig"]
