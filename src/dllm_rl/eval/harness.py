"""The evaluation harness: decode a task's held-out items under one or more decoding settings, score them,
and write per-sample results (JSON lines), a summary JSON, a Markdown table and an accuracy-vs-NFE plot.
(A few lines over the project's 400: the config, the settings language and provenance already live in their own
modules; what remains is the one evaluation loop and its resume logic, read top to bottom.)

Reproducible and resumable by construction:

- sample ``s`` of item ``i`` is decoded with its own seed ``sample_seed(seed, i, s)`` (the sampler gives
  each sequence its own generator and is batch-invariant), so a result never depends on batching, on
  the order of work, or on which items an earlier, interrupted run had already finished;
- every finished batch is appended to ``items/<setting>.jsonl`` and flushed to disk; a re-run with the
  same output directory skips the ``(item, sample)`` pairs already there (a torn last line is dropped)
  and recomputes the summary from the records, so it gives the same final numbers;
- ``meta.json`` pins what the numbers depend on (model files, task, data hash, decoding settings, seed,
  dtype); resuming with a different evaluation in the same directory is refused.

Output directory::

    meta.json                 versions, device, dtype, model/data hashes, settings, seed, command
    items/<setting>.jsonl     one record per (item, sample): prompt, completion, reward, reason, ...
    summary.json / summary.md metrics per setting + metadata; the Markdown comparison table
    accuracy_vs_nfe.png       one point per setting
    traces/<setting>.html     decoding traces of the first items (``trace_items`` > 0)
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllm_rl.config import ConfigError, to_dict
from dllm_rl.errors import UserError
from dllm_rl.eval.config import EvalRunConfig
from dllm_rl.eval.learned import LearnedThresholds, head_meta, learned_head
from dllm_rl.eval.provenance import (
    check_resume,
    data_fingerprint,
    environment,
    merge_meta,
    model_fingerprint,
    write_json,
)
from dllm_rl.eval.settings import (
    ResolvedSetting,
    Setting,
    load_settings_file,
    parse_setting,
    resolve_decode,
    threshold_settings,
)
from dllm_rl.jsonl import JSONLError, append_jsonl, read_jsonl, repair_jsonl
from dllm_rl.models.checks import check_model_tokenizer
from dllm_rl.models.devices import resolve_device, resolve_eval_dtype
from dllm_rl.seeding import derive_seed

#: how a sample's decoding seed is made (in meta.json; a directory of another rule is not resumed)
SEED_RULE = "sample s of item i decodes with dllm_rl.seeding.derive_seed(seed, i, s)"


# ------------------------------------------------------------------------------------------------ helpers
def sample_seed(seed: int, index: int, sample: int) -> int:
    """The decoding seed of sample ``sample`` of item ``index`` (independent of batching and order)."""
    return derive_seed(seed, index, sample)


def read_records(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Records of a results file; a torn last line (an interrupted write) is dropped with a warning, and
    removed from the file when ``repair`` (before appending to it). A bad line elsewhere is an error naming
    the line."""
    if not path.is_file():
        return []
    try:
        return repair_jsonl(path) if repair else read_jsonl(path)
    except JSONLError as err:
        raise ValueError(f"{err}; delete that line or use --overwrite") from None


def is_correct(score: Any) -> bool:
    """A sample counts as correct when the task says so (``info['correct']`` or sudoku's ``solved``),
    else when its reward is at least 1 (the task's own accuracy rule)."""
    info = getattr(score, "info", None) or {}
    for key in ("correct", "solved"):
        if key in info:
            return bool(info[key])
    return float(score) >= 1.0


def _task_kwargs(cfg: EvalRunConfig) -> dict[str, Any]:
    kw = dict(cfg.task_options)
    kw["split"] = cfg.split
    if cfg.data is not None:
        kw["data"] = cfg.data
    if cfg.prompt_style is not None:
        kw["prompt_style"] = cfg.prompt_style
    if cfg.system_prompt is not None:
        kw["system_prompt"] = cfg.system_prompt
    return kw


def load_task(cfg: EvalRunConfig):
    """The task with its examples loaded (unknown tasks and missing files fail here, before any compute)."""
    from dllm_rl.tasks import get_task

    if cfg.data is not None and not Path(cfg.data).expanduser().exists():
        raise FileNotFoundError(f"data file {cfg.data} does not exist")
    kwargs = _task_kwargs(cfg)
    try:
        task = get_task(cfg.task, **kwargs)
    except TypeError as exc:  # an option the task class does not take
        m = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if m is None:
            raise
        raise UserError(f"task {cfg.task!r} takes no option {m.group(1)}={kwargs.get(m.group(1))!r}; remove it "
                        "from task_options") from None
    if not task.has_verifier and task.custom_reward is None:
        raise UserError(f"task {task.name!r} has no verifier to score an evaluation; pass "
                        "--task-options reward_fn=package.module:function")
    examples = task.load()
    if not examples:
        from dllm_rl.tasks.base import DataError

        raise DataError(f"{task.source}: no items to evaluate (task {cfg.task!r}); give a file with at least one item")
    return task, examples


def _reference(example: Mapping[str, Any], max_chars: int = 2000) -> dict[str, Any]:
    """The example's columns other than the prompt, for the per-item record (long values cut)."""
    out = {}
    for k, v in example.items():
        if k == "prompt":
            continue
        s = v if isinstance(v, (int, float, bool)) or v is None else str(v)
        if isinstance(s, str) and len(s) > max_chars:
            s = s[:max_chars] + "..."
        out[k] = s
    return out


# ------------------------------------------------------------------------------------------------ run
@dataclass
class PreparedEval:
    """Everything validated and loaded before the first forward pass."""

    cfg: EvalRunConfig
    task: Any
    examples: list[dict[str, Any]]
    tokenizer: Any
    family: Any
    block_size: int | None
    decodes: dict[str, ResolvedSetting]
    settings: list[Setting]
    device: Any
    dtype: str
    meta: dict[str, Any]
    out: Path
    head: Any = None  # the threshold head of the learned settings (dllm_rl.eval.learned)


def prepare(cfg: EvalRunConfig) -> PreparedEval:
    """Validate the whole evaluation (task, data, model, tokenizer, settings, output directory) without
    loading weights or computing anything; raise ValueError / FileNotFoundError with a clear message."""
    cfg = cfg.resolved()
    out = Path(cfg.run.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output directory {out} is a file; give a directory (-o)")
    from dllm_rl.hub import resolve_model_path

    model_dir = resolve_model_path(cfg.model.path)  # a directory or a hub id
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    task, examples = load_task(cfg)
    if cfg.limit is not None:
        examples = examples[: cfg.limit]
    tokenizer_dir = resolve_model_path(cfg.model.tokenizer or cfg.model.path)
    tok, fam, block_size = check_model_tokenizer(model_dir, tokenizer_dir)
    if is_image_task(task):
        from dllm_rl.models.image_inputs import refuse_images

        refuse_images(fam.name, f"task {cfg.task!r} has images")
    if cfg.decode.block_size is not None:  # reaches the sampler as DecodeConfig.block_size
        if block_size is None:
            raise UserError(f"decode.block_size: for block models (SDAR/TraDo) only; {fam.name} is a full-attention "
                             "model (its decoding block is decode.block_length)")
        block_size = cfg.decode.block_size
    base = {**to_dict(cfg.decode), **({"decoding": cfg.decoding} if cfg.decoding != "config" else {})}
    curve = threshold_settings(cfg.thresholds, base) if cfg.thresholds else []
    given = (load_settings_file(cfg.settings_file) if cfg.settings_file else []) + [parse_setting(s)
                                                                                      for s in cfg.setting]
    settings = given or ([Setting("default")] if not curve or cfg.decoding == "learned" else [])
    settings += curve
    names = [s.name for s in settings]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"setting name {dup[0]!r} is used twice; give each --setting its own name")
    decodes = {s.name: resolve_decode(base, s, block_size) for s in settings}
    check_settings_noise(fam, cfg, settings, decodes)
    for name, rs in decodes.items():
        if cfg.num_samples > 1 and rs.decode.temperature == 0:
            warnings.warn(f"setting {name!r}: temperature 0 (greedy) makes all {cfg.num_samples} samples of an "
                          "item identical, so pass@k = pass@1; set temperature > 0", stacklevel=2)
    device = resolve_device(cfg.model.device, "model.device")
    dtype = resolve_eval_dtype(cfg.model.dtype, device)
    meta = {
        "model": model_fingerprint(model_dir),
        "family": fam.name,
        "tokenizer": str(tokenizer_dir.resolve()),
        "task": cfg.task,
        "split": cfg.split,
        "data": data_fingerprint(task, task.load()),
        "prompt_style": getattr(task, "prompt_style", cfg.prompt_style),
        "system_prompt": cfg.system_prompt,
        "task_options": to_dict(cfg.task_options),
        "limit": cfg.limit,
        "items": len(examples),
        "num_samples": cfg.num_samples,
        "seed": cfg.run.seed,
        "seed_rule": SEED_RULE,
        "dtype": dtype,
        "settings": {n: {"overrides": to_dict(s.overrides), "decode": decodes[n].as_dict()}
                     for n, s in zip(names, settings)},
        "environment": environment(device, dtype),
        "command": cfg.command,
    }
    if cfg.decode.block_size is not None:  # only when given, so that earlier evaluations still resume
        meta["block_size"] = cfg.decode.block_size
    head = learned_head(decodes, cfg.decoding, model_dir, fam, is_image_task(task))  # before the model
    if head is not None:
        meta["threshold_head"] = head_meta(head)
    check_resume(out, meta, cfg.run.overwrite)
    return PreparedEval(cfg, task, examples, tok, fam, block_size, decodes, settings, device, dtype, meta, out, head)



def check_settings_noise(fam, cfg: EvalRunConfig, settings: list[Setting], decodes: dict) -> None:
    """Each setting's decoding against the family's kind of noise, before the model loads, naming what the user
    gave: ``thresholds`` and ``tokens_per_step`` (masked schedules; a uniform-state family has neither), else the
    setting and its key (the sampler's own check, :func:`~dllm_rl.sampling.inputs.check_family_fields`)."""
    from dllm_rl.sampling.inputs import check_family_fields

    if fam.noise == "uniform":
        if cfg.thresholds:
            raise UserError(f"thresholds: the curve varies the masked samplers' confidence threshold; {fam.name} is "
                            "uniform-state diffusion: compare its own with --setting NAME:confidence_threshold=X")
        shortcut = next((s.name for s in settings if "tokens_per_step" in s.overrides), None)
        if shortcut is not None:
            raise UserError(f"setting {shortcut!r}: tokens_per_step sets a masked static schedule; {fam.name} is "
                            "uniform-state diffusion: set max_denoising_steps instead")
        uncached = next((s.name for s in settings if not decodes[s.name].block_cache), None)
        if uncached is not None:
            raise UserError(f"setting {uncached!r}: block_cache=false is for masked block models; {fam.name} decodes "
                            "whole canvases from random ids: drop it")
    for s in settings:
        try:
            check_family_fields(fam, decodes[s.name].decode)
        except UserError as exc:
            raise UserError(f"setting {s.name!r}: {exc}") from None


def run_eval(cfg: EvalRunConfig, model=None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) an evaluation; returns the summary dict (also written to ``summary.json``).

    ``model`` may be a loaded :class:`~dllm_rl.models.DiffusionLM` (tests, in-process use); by default the
    checkpoint ``cfg.model.path`` is loaded after every check has passed.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    prep = prepare(cfg)
    cfg, out = prep.cfg, prep.out
    if cfg.run.overwrite and out.exists():
        for p in [out / "meta.json", out / "summary.json", out / "summary.md", out / "accuracy_vs_nfe.png"]:
            p.unlink(missing_ok=True)
        for d in (out / "items", out / "traces"):
            if d.is_dir():
                for p in d.iterdir():
                    p.unlink()
    (out / "items").mkdir(parents=True, exist_ok=True)
    meta = merge_meta(out, prep.meta)
    write_json(out / "meta.json", meta)

    if model is None:
        from dllm_rl.models import load_model
        from dllm_rl.threads import use_cpu_threads

        log(f"loading {cfg.model.path} ({prep.family.name}, {prep.dtype}, {prep.device})")
        model = load_model(cfg.model.path, dtype=prep.dtype, device=prep.device, tokenizer_dir=cfg.model.tokenizer)
        use_cpu_threads(prep.device, cfg.threads)
    prompt_texts = [prep.task.build_prompt(ex, prep.tokenizer) for ex in prep.examples]
    inputs = PromptInputs(prep, model, prompt_texts)
    if not inputs.with_images:
        from dllm_rl.sampling.inputs import check_inputs

        for rs in prep.decodes.values():  # prompt lengths vs context, gen_length vs block: before decoding anything
            check_inputs(model, inputs.text_ids, rs.decode, None)
    for setting in prep.settings:
        _run_setting(prep, model, setting, inputs, log)
    summary = write_summary(prep)
    for name, s in summary["settings"].items():
        m = s["metrics"]
        log(f"[{name}] accuracy {m['accuracy']:.4f}  NFE {m['nfe_mean']:.1f}  length {m['mean_length']:.1f}  "
            f"tokens/s {m['tokens_per_s']:.1f}")
    log(f"wrote {out / 'summary.json'}, {out / 'summary.md'}, {out / 'accuracy_vs_nfe.png'}")
    return summary


def _encode(tokenizer, text: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"prompt {text[:60]!r} encodes to no tokens")
    return list(ids)


def is_image_task(task) -> bool:
    from dllm_rl.tasks.image_task import ImageTask

    return isinstance(task, ImageTask)


class PromptInputs:
    """What ``generate`` takes for a batch of items: their prompt ids and, for LLaDA-V, the image features.

    A text task's ids are encoded once. An image task's are built per batch
    (:class:`dllm_rl.models.image_inputs.PromptEncoder`), so only one batch of image features is held at a
    time (an 8B LLaDA-V image is thousands of embedding rows); items are then grouped by prompt text length."""

    def __init__(self, prep: PreparedEval, model, texts: list[str]):
        self.prep, self.model, self.texts = prep, model, texts
        self.with_images = is_image_task(prep.task)
        self.learned = None  # each item's learned threshold, when a setting decodes learned
        if prep.head is not None:
            self.learned = LearnedThresholds(prep.head, model)
        self.text_ids = None if self.with_images else [_encode(prep.tokenizer, t) for t in texts]
        self.prompts = None
        if self.with_images:
            from dllm_rl.hub import resolve_model_path
            from dllm_rl.models.image_inputs import PromptEncoder

            self.prompts = PromptEncoder(prep.tokenizer, resolve_model_path(prep.cfg.model.path))
            if model.family.name == "mmada":
                self.prompts.vq(model.device)  # a missing VQ encoder fails before the first batch

    def length(self, i: int) -> int:
        return len(self.texts[i]) if self.text_ids is None else len(self.text_ids[i])

    def batch(self, items: list[int]) -> tuple[list[list[int]], Any, list[list[Any]]]:
        """Prompt ids, LLaDA-V's ``PromptImages`` (or None) and the PIL images of ``items`` (in order)."""
        if self.text_ids is not None:
            return [self.text_ids[i] for i in items], None, [[] for _ in items]
        task, examples = self.prep.task, self.prep.examples
        images = [task.images(examples[i]) for i in items]
        ids, pim = self.prompts.encode(self.model, [self.texts[i] for i in items], images)
        return ids, pim, images


def _decode_chunk(model, ids, resolved: ResolvedSetting, seeds, tokenizer, images, slots: int | None,
                  thresholds: list[float] | None = None):
    """One batch of samples: fixed (``generate``) or, with ``slots`` or a learned setting's ``thresholds`` (one per
    row), through the continuous-batching engine (the same tokens; the uncached reference setting always decodes in
    a fixed batch)."""
    import dllm_rl.sampling as sampling

    if thresholds is None and (slots is None or not resolved.block_cache):
        return sampling.generate(model, ids, resolved.decode, seeds=seeds, tokenizer=tokenizer,
                                 block_cache=resolved.block_cache, images=images)
    from dllm_rl.sampling.engine import EngineConfig

    return sampling.generate_batched(model, ids, resolved.decode, seeds=seeds, tokenizer=tokenizer, images=images,
                                     engine=EngineConfig(slots=slots or len(ids)), thresholds=thresholds)


def _run_setting(prep: PreparedEval, model, setting: Setting, inputs: PromptInputs,
                 log: Callable[[str], None]) -> None:
    cfg, resolved = prep.cfg, prep.decodes[setting.name]
    path = prep.out / "items" / f"{setting.name}.jsonl"
    done = {(r["index"], r["sample"]) for r in read_records(path, repair=True)}
    pending = [(i, s) for i in range(len(prep.examples)) for s in range(cfg.num_samples) if (i, s) not in done]
    total = len(prep.examples) * cfg.num_samples
    if not pending:
        log(f"[{setting.name}] all {total} samples already in {path}")
    else:
        if done:
            log(f"[{setting.name}] resuming: {len(done)} of {total} samples already in {path}")
        # Similar lengths together (less padding); results do not depend on the grouping.
        pending.sort(key=lambda p: (inputs.length(p[0]), p[0], p[1]))
        bar = None
        if cfg.run.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=total - len(pending), desc=setting.name, unit="sample",
                       dynamic_ncols=True, file=sys.stderr)
        n_correct = 0
        n_new = 0
        for start in range(0, len(pending), cfg.batch_size):
            chunk = pending[start: start + cfg.batch_size]
            seeds = [sample_seed(cfg.run.seed, i, s) for i, s in chunk]
            t0 = time.perf_counter()
            ids, images, _ = inputs.batch([i for i, _ in chunk])
            taus = inputs.learned([i for i, _ in chunk], ids) if resolved.learned else None
            roll = _decode_chunk(model, ids, resolved, seeds, prep.tokenizer, images, cfg.slots, taus)
            if prep.device.type == "cuda":
                import torch

                torch.cuda.synchronize(prep.device)
            elapsed = time.perf_counter() - t0
            exs = [prep.examples[i] for i, _ in chunk]
            scores = prep.task.score_examples(roll.texts, exs)
            lengths = roll.completion_lengths().tolist()
            records = []
            for b, ((i, s), score) in enumerate(zip(chunk, scores)):
                ok = is_correct(score)
                n_correct += ok
                rec = {
                    "setting": setting.name, "index": i, "sample": s, "seed": seeds[b],
                    "prompt": inputs.texts[i], "completion": roll.texts[b], "reward": float(score),
                    "correct": ok, "reason": getattr(score, "reason", ""), "length": int(lengths[b]),
                    "nfe": int(roll.nfe[b]), "finish_reason": roll.finish_reason[b],
                    "gen_seconds": elapsed / len(chunk), "reference": _reference(prep.examples[i]),
                }
                info = getattr(score, "info", None)
                if info:
                    rec["score_info"] = info
                if taus is not None:
                    rec["threshold"] = taus[b]
                records.append(rec)
            append_jsonl(path, records, fsync=True)  # on disk before the next batch: a kill loses this one at most
            n_new += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
                bar.set_postfix(acc=f"{n_correct / n_new:.3f}", tok_s=f"{sum(lengths) / max(elapsed, 1e-9):.1f}")
        if bar is not None:
            bar.close()
    if prep.cfg.trace_items > 0:
        _write_traces(prep, model, setting, inputs, resolved)


def _write_traces(prep: PreparedEval, model, setting: Setting, inputs: PromptInputs,
                  resolved: ResolvedSetting) -> None:
    from dllm_rl.eval.trace_viewer import records_from_rollout, write_html
    from dllm_rl.models.image_inputs import image_spans

    n = min(prep.cfg.trace_items, len(prep.examples))
    seeds = [sample_seed(prep.cfg.run.seed, i, 0) for i in range(n)]
    prompt_ids, pim, images = inputs.batch(list(range(n)))
    taus = inputs.learned(list(range(n)), prompt_ids) if resolved.learned else None
    roll = _decode_chunk(model, prompt_ids, resolved, seeds, prep.tokenizer, pim, None, taus)
    recs = records_from_rollout(roll, prep.tokenizer, labels=[f"item {i}" for i in range(n)],
                                block_length=roll.block_size or resolved.decode.block_length,
                                block_offsets=[len(p) for p in prompt_ids] if roll.block_size else None,
                                images=images if inputs.with_images else None,
                                image_spans=image_spans(model, prompt_ids, pim) if inputs.with_images else None)
    scores = prep.task.score_examples(roll.texts, prep.examples[:n])
    for r, sc in zip(recs, scores):
        r.reward = float(sc)
    (prep.out / "traces").mkdir(exist_ok=True)
    write_html(prep.out / "traces" / f"{setting.name}.html", recs, title=f"{prep.cfg.task}: {setting.name}",
               meta={"model": prep.cfg.model.path, "setting": setting.name, **resolved.as_dict()})


def write_summary(prep: PreparedEval) -> dict[str, Any]:
    """Summary JSON + Markdown + plot from the records on disk (only the current items and samples)."""
    from dllm_rl.eval.report import accuracy_curve, markdown_table, plot_accuracy_vs_nfe, summarize_records

    n_items, k = len(prep.examples), prep.cfg.num_samples
    settings = {}
    for setting in prep.settings:
        path = prep.out / "items" / f"{setting.name}.jsonl"
        seen: dict[tuple[int, int], dict[str, Any]] = {}
        for r in read_records(path):
            if r["index"] < n_items and r["sample"] < k:
                seen.setdefault((r["index"], r["sample"]), r)
        recs = [seen[key] for key in sorted(seen)]
        if len(recs) != n_items * k:
            raise RuntimeError(f"{path}: {len(recs)} of {n_items * k} samples present after the run")
        settings[setting.name] = {"overrides": to_dict(setting.overrides),
                                  "decode": prep.decodes[setting.name].as_dict(),
                                  "metrics": summarize_records(recs, k), "items_file": str(path)}
    summary = {"model": prep.cfg.model.path, "task": prep.cfg.task, "split": prep.cfg.split,
               "num_samples": k, "items": n_items, "command": prep.cfg.command or "", "settings": settings,
               "meta": {key: v for key, v in prep.meta.items() if key != "settings"}}
    if prep.cfg.thresholds:
        curve = threshold_settings(prep.cfg.thresholds, to_dict(prep.cfg.decode))
        summary["curve"] = accuracy_curve(settings, {s.name: s.overrides["threshold"] for s in curve})
    write_json(prep.out / "summary.json", summary)
    (prep.out / "summary.md").write_text(markdown_table(summary))
    plot_accuracy_vs_nfe(summary, prep.out / "accuracy_vs_nfe.png")
    return summary
