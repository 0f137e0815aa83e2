"""Unbiased pass@k.

Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", the Codex paper), Eq. 1: with ``n``
samples per problem of which ``c`` are correct,

    pass@k = E_problems[ 1 - C(n - c, k) / C(n, k) ].

The ratio of binomials is computed as the product ``prod_{i = n - c + 1}^{n} (1 - k / i)`` (the paper's
numerically stable form), which never forms a large binomial coefficient.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dllm_rl.jsonl import read_jsonl


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``n`` samples, ``c`` of them correct (Chen et al. 2021, Eq. 1).

    ``1 - C(n - c, k) / C(n, k)``; equals 1 when fewer than ``k`` samples are wrong.
    """
    if n < 1 or k < 1:
        raise ValueError(f"pass@k needs n >= 1 and k >= 1 (got n={n}, k={k})")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n (got n={n}, c={c})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("pass@k of an empty set of problems")
    return float(np.mean(values))


def default_ks(num_samples: int) -> list[int]:
    """The k reported for ``num_samples`` samples per item: 1, 2, 4, ... and ``num_samples`` itself."""
    ks, k = [], 1
    while k < num_samples:
        ks.append(k)
        k *= 2
    ks.append(num_samples)
    return ks


def correct_counts(records: Iterable[Mapping[str, Any]], key: str = "index") -> dict[Any, tuple[int, int]]:
    """``{item: (n, c)}`` from per-sample result records (each with ``key`` and a boolean ``correct``)."""
    n: dict[Any, int] = defaultdict(int)
    c: dict[Any, int] = defaultdict(int)
    for rec in records:
        n[rec[key]] += 1
        c[rec[key]] += int(bool(rec["correct"]))
    return {item: (n[item], c[item]) for item in n}


def pass_at_k_from_records(records: Iterable[Mapping[str, Any]], ks: Iterable[int] | None = None,
                           key: str = "index") -> dict[int, float]:
    """``{k: pass@k}`` over the items in ``records`` (per-sample dicts with ``key`` and ``correct``).

    Every item must have the same number of samples ``n``; by default k runs over :func:`default_ks` (n).
    """
    counts = correct_counts(records, key)
    if not counts:
        raise ValueError("no results to compute pass@k from")
    ns = {n for n, _ in counts.values()}
    if len(ns) != 1:
        raise ValueError(f"items have different numbers of samples {sorted(ns)}; pass@k needs the same n")
    (n,) = ns
    return {k: mean_pass_at_k(counts.values(), k) for k in (ks or default_ks(n))}


def pass_at_k_from_file(path: str | Path, ks: Iterable[int] | None = None, key: str = "index") -> dict[int, float]:
    """pass@k from a results JSON-lines file (one per-sample record a line, as ``dllm-rl eval`` writes)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file not found")
    records = read_jsonl(path)  # an eval killed mid-write: its torn last line is dropped with a warning
    return pass_at_k_from_records(records, ks, key)
