"""Metrics as JSON lines, a tqdm progress bar with loss / tokens/s / ETA, and PNG curves."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dllm_rl.errors import UserError
from dllm_rl.jsonl import append_jsonl, keep_rows_through, read_jsonl, write_jsonl

METRICS_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLogger:
    """Append one JSON object per :meth:`log` call to ``path`` (``{"step": ..., "time": ..., **metrics}``).

    ``resume_step``: drop the lines of steps after it first (a run resumed from a checkpoint at that step
    rewrites them, so the file never holds two histories; the file is rewritten atomically), else start an
    empty file. ``enabled=False`` (non-main ranks) writes nothing. The rules of :mod:`dllm_rl.jsonl` apply.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_jsonl(self.path, [])
        else:
            keep_rows_through(self.path, resume_step)

    def log(self, step: int, **metrics: Any) -> dict[str, Any]:
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({k: _plain(v) for k, v in metrics.items()})
        if self.enabled:
            append_jsonl(self.path, [row])
        return row


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics JSONL file: a torn last line (a crash mid-write) is dropped with a warning, a bad
    line before it is an error naming the file and line (:func:`dllm_rl.jsonl.read_jsonl`)."""
    return read_jsonl(path)


class Progress:
    """A tqdm bar over optimizer steps showing loss, tokens/s (smoothed over the run) and tqdm's ETA."""

    def __init__(self, total: int, initial: int = 0, desc: str = "train", disable: bool = False):
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True, unit="step")
        self.start = time.perf_counter()
        self.tokens = 0

    def update(self, steps: int = 1, tokens: int = 0, **metrics: float) -> float:
        """Advance by ``steps``; ``tokens`` processed since the last call; returns the run's tokens/s."""
        self.tokens += int(tokens)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tps = self.tokens / elapsed
        post = {k: f"{float(v):.4g}" for k, v in metrics.items()}
        post["tok/s"] = f"{tps:.0f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(steps)
        return tps

    def write(self, message: str) -> None:
        self.bar.write(message)

    def close(self) -> None:
        self.bar.close()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "metric"


def plot_metrics(run_dir: str | Path, keys: list[str] | None = None) -> list[Path]:
    """Write one PNG per numeric metric of ``run_dir/metrics.jsonl`` against ``step`` into ``run_dir/plots``.

    ``keys`` selects metrics (default: every numeric key except ``step`` and ``time``). Returns the PNG
    paths. Uses matplotlib's Agg backend (no display needed).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {run_dir} a run directory?)")
    rows = read_metrics(path)
    numeric: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if "step" not in r:
            continue
        for k, v in r.items():
            if k in ("step", "time") or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            numeric.setdefault(k, []).append((float(r["step"]), float(v)))
    if keys is None:
        keys = sorted(numeric)
    else:
        unknown = [k for k in keys if k not in numeric]
        if unknown:
            raise UserError(f"{path}: no numeric metric {unknown[0]!r}; available: {', '.join(sorted(numeric))}")
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys:
        pts = numeric[key]
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None, linewidth=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.set_title(f"{run_dir.name}: {key}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        target = out_dir / f"{_safe(key)}.png"
        fig.savefig(target)
        plt.close(fig)
        written.append(target)
    return written
