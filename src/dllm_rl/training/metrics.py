"""Metrics as JSON lines (forwarded to the ``report_to`` trackers) and the tqdm progress line.

The dashboard and per-metric PNGs are drawn by :mod:`dllm_rl.training.plots`."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dllm_rl.jsonl import append_jsonl, keep_rows_through, read_jsonl, write_jsonl

METRICS_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Append one JSON object per :meth:`log` call to ``path`` (``{"step": ..., "time": ..., **metrics}``) and
    send its numbers, under the same names and step, to the ``report_to`` trackers
    (:mod:`dllm_rl.training.trackers`; ``config``: the resolved config, logged as hyperparameters).

    ``resume_step``: drop the lines of steps after it first (a run resumed from a checkpoint at that step
    rewrites them, so the file never holds two histories; the file is rewritten atomically), else start an
    empty file. ``enabled=False`` (non-main ranks) writes nothing. The rules of :mod:`dllm_rl.jsonl` apply.
    Call :meth:`close` at the end of the run (it finishes the trackers).
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True,
                 report_to: list[str] | tuple[str, ...] = (), config: dict[str, Any] | None = None):
        self.path = Path(path)
        self.enabled = enabled
        self.trackers: list = []
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_jsonl(self.path, [])
        else:
            keep_rows_through(self.path, resume_step)
        if report_to:
            from dllm_rl.training.trackers import open_trackers

            self.trackers = open_trackers(list(report_to), self.path.parent, config)

    def log(self, step: int, **metrics: Any) -> dict[str, Any]:
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({k: _plain(v) for k, v in metrics.items()})
        if self.enabled:
            append_jsonl(self.path, [row])
            numbers = {k: v for k, v in row.items() if k not in ("step", "time") and _is_number(v)}
            for tracker in self.trackers:
                tracker.log(numbers, step=int(step))
        return row

    def close(self) -> None:
        """Finish the trackers (flush and close their files); safe to call more than once."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.finish()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics JSONL file: a torn last line (a crash mid-write) is dropped with a warning, a bad
    line before it is an error naming the file and line (:func:`dllm_rl.jsonl.read_jsonl`)."""
    return read_jsonl(path)


class Progress:
    """A tqdm line over optimizer steps: the metrics passed to :meth:`update`, tokens/s (over the run) and ETA."""

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:12}| {n_fmt}/{total_fmt} [{elapsed}, ETA {remaining}{postfix}]"

    def __init__(self, total: int, initial: int = 0, desc: str = "train", disable: bool = False,
                 note: str | None = None):
        """``note``: a line written once above the bar (e.g. :data:`ZERO_LOSS_NOTE`), unless disabled."""
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True, unit="step",
                        bar_format=self.BAR_FORMAT)
        if note and not disable:
            self.bar.write(note)
        self.start = time.perf_counter()
        self.tokens = 0

    def update(self, steps: int = 1, tokens: int = 0, **metrics: float | str) -> float:
        """Advance by ``steps``; ``tokens`` processed since the last call; returns the run's tokens/s.
        Numbers are shown with 4 significant digits, strings as given; None values are left out."""
        self.tokens += int(tokens)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tps = self.tokens / elapsed
        post = {k: (v if isinstance(v, str) else f"{float(v):.4g}") for k, v in metrics.items() if v is not None}
        post["tok/s"] = f"{tps:.0f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(steps)
        return tps

    @property
    def postfix(self) -> str:
        """The text after the ETA (what :meth:`update` last set)."""
        return self.bar.postfix or ""

    def write(self, message: str) -> None:
        self.bar.write(message)

    def close(self) -> None:
        self.bar.close()


#: why the progress line of a sequence-level loss leaves the loss out
ZERO_LOSS_NOTE = ("progress: loss not shown: a sequence-level loss over group-centred advantages is zero on the "
                  "first pass by construction (ratio 1); it is in metrics.jsonl")


def loss_is_informative(loss_type: str | None, loss_aggregation: str | None) -> bool:
    """False for losses whose value on the first pass is zero by construction: ESPO's sequence-level loss
    (arXiv 2512.03759, eq. 7-9) and ``seq_mean`` aggregation, whose per-sequence terms at ratio 1 are the
    advantages, which sum to zero per group (GRPO, arXiv 2402.03300, eq. 3)."""
    return loss_type != "sequence" and loss_aggregation != "seq_mean"


def rl_progress(metrics: dict[str, Any], *, held_out: float | None = None, show_loss: bool = True) -> dict:
    """The progress-line fields of one RL step: reward, held-out accuracy (when known), KL, clip fraction
    and (``show_loss``) the loss."""
    fields = {"reward": metrics.get("reward"), "held_out": held_out, "kl": metrics.get("kl"),
              "clip": metrics.get("clip_frac")}
    if show_loss:
        fields["loss"] = metrics.get("loss")
    return {k: v for k, v in fields.items() if v is not None}
