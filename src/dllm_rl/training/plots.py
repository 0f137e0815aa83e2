"""One dashboard per run (``dashboard.png``), runs overlaid for comparison, and opt-in per-metric PNGs.

Panels of :func:`dashboard_figure`, in order (each run one colour, labelled by its directory name):

1. ``reward`` raw (thin) with a trailing moving average (thick); an SFT run (no reward) shows ``loss``; a run with
   a rollout hook adds ``reward_policy`` smoothed (dashed): the reward of the policy's own samples, before the hook
   replaced any (IGPO's inpainted ones);
2. held-out accuracy (``eval_accuracy``, markers);
3. ``kl`` (left axis) and ``clip_frac`` (right axis, dashed);
4. ``completion_length`` and ``nfe`` (dashed);
5. seconds per step: ``time_rollout``, ``time_reward``, ``time_update`` (solid, dashed, dotted);
6. held-out accuracy against forward passes per answer (``eval_accuracy`` vs ``eval_nfe``), one marker per
   evaluation joined in step order, the first and last labelled with their step: a run that learns to decode in
   fewer passes moves left, one that learns the task moves up.

The panels sit in 2 rows of 3 at 1600 x 850 px (one laptop screen); "no data" is written only on a panel with no
point in it (panel 3 counting its right-hand axis). matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dllm_rl.errors import UserError
from dllm_rl.training.metrics import METRICS_FILE, read_metrics

DASHBOARD = "dashboard.png"
PANELS = ("reward", "held-out accuracy", "KL and clip fraction", "completion length and NFE", "seconds per step",
          "held-out accuracy vs passes")
STYLES = ("-", "--", ":")
#: the dashboard's panels in rows x columns, and its size: 1600 x 850 px, readable on a laptop screen at once
GRID = (2, 3)
FIGSIZE = (16.0, 8.5)
DPI = 100
#: values beyond this magnitude are left out of a plot: matplotlib cannot place ticks on an axis spanning
#: ~1e308 (a diverged loss), and such a point would flatten every other one anyway
PLOT_LIMIT = 1e150


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= PLOT_LIMIT


def series(rows: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of the rows whose step and ``key`` are numbers that can be drawn: a step that is
    missing or null, and a value that is not finite or beyond :data:`PLOT_LIMIT`, leave the row out."""
    pts = [(float(r["step"]), float(r[key])) for r in rows if _number(r.get("step")) and _number(r.get(key))]
    arr = np.array(pts, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def smooth(values: np.ndarray, window: int | None = None) -> np.ndarray:
    """Trailing moving average (the first points average what exists so far); ``window`` defaults to a tenth
    of the points, between 1 and 25."""
    n = len(values)
    if n == 0:
        return values
    w = window or max(1, min(25, n // 10))
    csum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, n + 1)
    lo = np.maximum(idx - w, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


def _run_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (is {run_dir} a run directory?)")
    return read_metrics(path)


def dashboard_figure(run_dirs: list[str | Path], smooth_window: int | None = None):
    """The dashboard :class:`matplotlib.figure.Figure` of one or more runs (see the module docs): the six panels
    in a grid of :data:`GRID` rows and columns, :data:`FIGSIZE` inches at :data:`DPI` (1600 x 850 px, a laptop
    screen). Its ``axes`` are the six panels in order, then the right-hand axis of panel 3 (``clip_frac``)."""
    plt = _pyplot()
    fig, grid = plt.subplots(*GRID, figsize=FIGSIZE, dpi=DPI)
    axes = grid.ravel()
    clip_ax = axes[2].twinx()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    first_key = "reward"
    for i, run_dir in enumerate(run_dirs):
        rows, name, colour = _run_rows(Path(run_dir)), Path(run_dir).resolve().name, colours[i % len(colours)]
        key = "reward" if len(series(rows, "reward")[0]) else "loss"
        first_key = key if i == 0 else first_key
        x, y = series(rows, key)
        axes[0].plot(x, y, color=colour, alpha=0.3, linewidth=0.8, label=f"{name} {key}")
        axes[0].plot(x, smooth(y, smooth_window), color=colour, linewidth=2, label=f"{name} {key} (smoothed)")
        x_policy, y_policy = series(rows, "reward_policy")
        if key == "reward" and len(x_policy):
            axes[0].plot(x_policy, smooth(y_policy, smooth_window), color=colour, linewidth=1.5, linestyle="--",
                         label=f"{name} reward_policy (smoothed)")
        axes[1].plot(*series(rows, "eval_accuracy"), color=colour, marker="o", label=name)
        axes[2].plot(*series(rows, "kl"), color=colour, label=f"{name} kl")
        clip_ax.plot(*series(rows, "clip_frac"), color=colour, linestyle="--", label=f"{name} clip_frac")
        for key2, style in (("completion_length", "-"), ("nfe", "--")):
            axes[3].plot(*series(rows, key2), color=colour, linestyle=style, label=f"{name} {key2}")
        for key2, style in zip(("time_rollout", "time_reward", "time_update"), STYLES):
            label = f"{name} {key2.removeprefix('time_')}"
            axes[4].plot(*series(rows, key2), color=colour, linestyle=style, label=label)
        _passes_panel(axes[5], rows, name, colour)
    _label_panels(axes, clip_ax, first_key)
    fig.tight_layout()
    return fig


def _drawn(ax) -> list:
    """The lines of ``ax`` that hold at least one point."""
    return [line for line in ax.lines if len(line.get_xdata())]


def _label_panels(axes, clip_ax, first_key: str) -> None:
    """Titles, axis labels and legends; "no data" only on a panel with no point at all (panel 3 counts its
    right-hand ``clip_frac`` axis: a run without KL still draws its clip fraction there)."""
    titles = (first_key,) + PANELS[1:]
    ylabels = (first_key, "accuracy", "kl", "tokens / forwards", "seconds", "accuracy")
    twins = {2: clip_ax}
    for i, (ax, title, ylabel) in enumerate(zip(axes, titles, ylabels)):
        ax.set_title(title)
        ax.set_xlabel("forward passes per answer" if i == 5 else "step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        lines = _drawn(ax) + (_drawn(twins[i]) if i in twins else [])
        if not lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        else:  # one legend per panel, the twin axis's lines in it too
            ax.legend(lines, [line.get_label() for line in lines], fontsize=7)
    clip_ax.set_ylabel("clip fraction")


def _passes_panel(ax, rows: list[dict[str, Any]], name: str, colour: str) -> None:
    """Panel 6: the run's held-out evaluations as (passes per answer, accuracy), in step order."""
    pts = [(float(r["step"]), float(r["eval_nfe"]), float(r["eval_accuracy"])) for r in rows
           if _number(r.get("step")) and _number(r.get("eval_nfe")) and _number(r.get("eval_accuracy"))]
    if not pts:
        return
    pts.sort()
    ax.plot([p[1] for p in pts], [p[2] for p in pts], color=colour, marker="o", label=name)
    for step, nfe, acc in {pts[0], pts[-1]}:
        ax.annotate(f"step {step:g}", (nfe, acc), textcoords="offset points", xytext=(4, 4), fontsize=7)


def write_dashboard(run_dirs: list[str | Path], out: str | Path | None = None,
                    smooth_window: int | None = None) -> Path:
    """Draw :func:`dashboard_figure` into ``out`` (default: ``RUN_DIR/dashboard.png`` for one run; several
    runs need ``out``): an image file whose suffix matplotlib writes (.png, .pdf, .svg, ...), or an existing
    directory, which gets ``dashboard.png``. Returns the path written."""
    if not run_dirs:
        raise UserError("give at least one run directory")
    if out is None and len(run_dirs) > 1:
        raise UserError("several runs are drawn on one page: say where with -o FILE.png")
    target = _dashboard_target(out) if out is not None else Path(run_dirs[0]) / DASHBOARD
    fig = dashboard_figure(run_dirs, smooth_window)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    _pyplot().close(fig)
    return target


def _dashboard_target(out: str | Path) -> Path:
    """Where ``-o OUT`` puts the dashboard (see :func:`write_dashboard`); an unknown suffix is refused
    before anything is drawn, where matplotlib would fail after, or append ``.png`` to a name without one."""
    target = Path(out)
    if target.is_dir():
        return target / DASHBOARD
    suffix = target.suffix.lower().lstrip(".")
    _pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    if suffix not in FigureCanvasBase.get_supported_filetypes():
        raise UserError(f"-o {out}: not an image file name ({f'.{suffix}' if suffix else 'no suffix'}); give "
                        "FILE.png, FILE.pdf or FILE.svg (or another suffix matplotlib writes) or an existing directory")
    return target


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "metric"


def plot_metrics(run_dir: str | Path, keys: list[str] | None = None) -> list[Path]:
    """Write one PNG per numeric metric of ``run_dir/metrics.jsonl`` against ``step`` into ``run_dir/plots``
    (``dllm-rl plot --per-metric``).

    ``keys`` selects metrics (default: every numeric key except ``step`` and ``time``). Returns the PNG paths.
    """
    plt = _pyplot()
    run_dir = Path(run_dir)
    rows = _run_rows(run_dir)
    numeric = sorted({k for r in rows for k, v in r.items() if k not in ("step", "time")
                      and isinstance(v, int | float) and not isinstance(v, bool)})
    if keys is None:
        keys = numeric
    else:
        unknown = [k for k in keys if k not in numeric]
        if unknown:
            raise UserError(f"{run_dir / METRICS_FILE}: no numeric metric {unknown[0]!r}; available: "
                            f"{', '.join(numeric)}")
    out_dir = run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys:
        x, y = series(rows, key)
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot(x, y, marker="." if len(x) < 50 else None, linewidth=1.2)
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
