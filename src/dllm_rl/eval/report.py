"""Evaluation reports: per-setting metrics from per-sample records, a summary JSON, a Markdown table and
an accuracy-vs-NFE plot (PNG).

Metrics (one decoding setting, ``n`` samples for each of ``N`` items):

- ``accuracy``: mean of ``correct`` over all ``N * n`` samples (= mean over items of per-item accuracy);
- ``pass@k``: the unbiased estimator of Chen et al. 2021, Eq. 1 (:mod:`dllm_rl.eval.passk`);
- ``mean_length``: answer tokens per sample (the completion up to and including its first EOS);
- ``nfe_mean``: forward passes (network function evaluations) per sample;
- ``nfe_per_token = sum(nfe) / sum(length)``, and its inverse ``tokens_per_nfe`` (decoding parallelism);
- ``tokens_per_s``: answer tokens per second of generation wall time (the only number that depends on
  the machine and on batching; everything else is a function of the written records);
- ``threshold_mean`` (a ``decoding: learned`` setting only): the mean of the items' learned thresholds.

With ``--thresholds`` the summary holds ``curve``: accuracy against forward passes, one point per confidence
threshold, each compared with the reference, threshold 1.0 (one token per step): ``accuracy_delta`` (points of
accuracy lost or won), ``fewer_passes`` (the reference's mean NFE over the point's) and ``tokens_per_nfe``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dllm_rl.eval.passk import correct_counts, default_ks, mean_pass_at_k


def summarize_records(records: Sequence[Mapping[str, Any]], num_samples: int | None = None) -> dict[str, Any]:
    """Metrics of one decoding setting from its per-sample records (see the module docstring)."""
    if not records:
        raise ValueError("no records to summarize")
    counts = correct_counts(records)
    ns = {n for n, _ in counts.values()}
    n = num_samples if num_samples is not None else max(ns)
    if ns != {n}:
        raise ValueError(f"items have {sorted(ns)} samples each, expected {n}: the evaluation is incomplete")
    lengths = [int(r["length"]) for r in records]
    nfes = [int(r["nfe"]) for r in records]
    seconds = sum(float(r.get("gen_seconds", 0.0)) for r in records)
    total_len = sum(lengths)
    out: dict[str, Any] = {
        "items": len(counts),
        "samples_per_item": n,
        "samples": len(records),
        "accuracy": sum(int(bool(r["correct"])) for r in records) / len(records),
        "mean_reward": sum(float(r["reward"]) for r in records) / len(records),
        "pass_at_k": {str(k): mean_pass_at_k(counts.values(), k) for k in default_ks(n)},
        "mean_length": total_len / len(records),
        "nfe_mean": sum(nfes) / len(records),
        "nfe_per_token": sum(nfes) / total_len if total_len else math.nan,
        "tokens_per_nfe": total_len / sum(nfes) if sum(nfes) else math.nan,
        "tokens_per_s": total_len / seconds if seconds > 0 else math.nan,
        "gen_seconds": seconds,
        "finish_reasons": dict(sorted(Counter(str(r.get("finish_reason")) for r in records).items())),
    }
    taus = [float(r["threshold"]) for r in records if "threshold" in r]  # a learned setting's per-item thresholds
    if taus:
        out["threshold_mean"] = sum(taus) / len(taus)
    return out


def accuracy_curve(settings: Mapping[str, Any], thresholds: Mapping[str, float]) -> dict[str, Any]:
    """The accuracy-vs-passes curve of the settings named in ``thresholds`` (name -> threshold; 1.0, one token
    per step, is the reference), highest threshold first."""
    ref_name = next(n for n, t in thresholds.items() if t == 1.0)
    ref = settings[ref_name]["metrics"]
    points = []
    for name, t in sorted(thresholds.items(), key=lambda kv: -kv[1]):
        m = settings[name]["metrics"]
        points.append({"setting": name, "threshold": t, "accuracy": m["accuracy"],
                       "accuracy_delta": m["accuracy"] - ref["accuracy"], "nfe_mean": m["nfe_mean"],
                       "fewer_passes": ref["nfe_mean"] / m["nfe_mean"] if m["nfe_mean"] else math.nan,
                       "tokens_per_nfe": m["tokens_per_nfe"]})
    return {"reference": ref_name, "points": points}


def curve_table(curve: Mapping[str, Any]) -> list[str]:
    """Markdown lines of :func:`accuracy_curve`: one row per threshold."""
    lines = ["## Accuracy vs forward passes", "",
             f"Each threshold against `{curve['reference']}` (threshold 1.0: one token per step).", "",
             "| threshold | accuracy | vs one per step | NFE per answer | fewer passes | tokens per forward |",
             "|---|---|---|---|---|---|"]
    for pt in curve["points"]:
        lines.append(f"| {pt['threshold']:g} | {_fmt(pt['accuracy'])} | {pt['accuracy_delta'] * 100:+.1f} pts | "
                     f"{_fmt(pt['nfe_mean'], 1)} | {_fmt(pt['fewer_passes'], 2)}x | {_fmt(pt['tokens_per_nfe'], 2)} |")
    return lines


def _fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def _decoding_cell(setting: Mapping[str, Any]) -> str:
    """A setting's overrides (``base``: none) and, decoding learned, its mean learned threshold."""
    over = dict(setting["overrides"])
    learned = setting["decode"].get("decoding") == "learned"
    if learned:
        over["decoding"] = "learned"
    dec = ", ".join(f"{k}={v}" for k, v in over.items()) or "base"
    if learned and "threshold_mean" in setting["metrics"]:
        dec += f" (mean threshold {setting['metrics']['threshold_mean']:.3f})"
    return dec


def markdown_table(summary: Mapping[str, Any]) -> str:
    """A Markdown report: the comparison table (one row per decoding setting) and the metadata."""
    settings = summary["settings"]
    ks = sorted({int(k) for s in settings.values() for k in s["metrics"]["pass_at_k"]})
    head = ["setting", "accuracy", *[f"pass@{k}" for k in ks if k > 1], "length", "NFE", "NFE/token",
            "tokens/NFE", "tokens/s", "decoding"]
    rows = []
    for name, s in settings.items():
        m = s["metrics"]
        dec = _decoding_cell(s)
        rows.append([name, _fmt(m["accuracy"]), *[_fmt(m["pass_at_k"].get(str(k), math.nan)) for k in ks if k > 1],
                     _fmt(m["mean_length"], 1), _fmt(m["nfe_mean"], 1), _fmt(m["nfe_per_token"]),
                     _fmt(m["tokens_per_nfe"], 2), _fmt(m["tokens_per_s"], 1), dec])
    lines = [f"# Evaluation: {summary['task']} ({summary['split']}), {summary['model']}", ""]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    meta = summary["meta"]
    if summary.get("curve"):
        lines += ["", *curve_table(summary["curve"])]
    lines += ["", f"{next(iter(settings.values()))['metrics']['items']} items x "
              f"{summary['num_samples']} samples; accuracy = mean over samples; pass@k unbiased (Chen et al. 2021).",
              "", "## Reproduce", "", "```", summary.get("command", ""), "```", "", "## Metadata", ""]
    for k, v in meta.items():
        if k == "settings":
            continue
        lines.append(f"- {k}: `{json.dumps(v) if isinstance(v, (dict, list)) else v}`")
    lines += ["", "### Decoding settings (resolved)", ""]
    for name, s in settings.items():
        lines.append(f"- {name}: `{json.dumps(s['decode'], sort_keys=True)}`")
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_nfe(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Accuracy against mean NFE per sample, one labelled point per decoding setting (PNG)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    try:
        for name, s in summary["settings"].items():
            m = s["metrics"]
            ax.scatter([m["nfe_mean"]], [m["accuracy"]], s=40)
            ax.annotate(name, (m["nfe_mean"], m["accuracy"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
        if summary.get("curve"):  # the thresholds' points joined, in order of passes
            pts = sorted(summary["curve"]["points"], key=lambda p: p["nfe_mean"])
            ax.plot([p["nfe_mean"] for p in pts], [p["accuracy"] for p in pts], color="grey", linewidth=1, zorder=0)
        ax.set_xlabel("NFE per sample (forward passes)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{Path(str(summary['task'])).name}: accuracy vs NFE")
        ax.grid(alpha=0.3)
        ax.margins(x=0.15)
        ax.set_ylim(-0.03, 1.05)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
