"""Rank helpers: decisions on the largest value over ranks, metric means, padded micro-batches, the zero loss."""

from __future__ import annotations

import math

import torch

import dllm_rl.training.ranks as ranks
from dllm_rl.training.run_log import RolloutLog


class TwoRanks:
    """An accelerator of two processes whose other rank reports ``other``."""

    num_processes = 2
    device = torch.device("cpu")

    def __init__(self, other: int):
        self.other = other

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.tensor([self.other])])


class OneRank:
    num_processes = 1
    device = torch.device("cpu")

    def gather(self, t):  # a one-process run never gathers
        raise AssertionError("gathered on one rank")


def test_max_over_ranks_and_skip_together():
    assert ranks.max_over_ranks(OneRank(), 3) == 3
    assert ranks.max_over_ranks(TwoRanks(other=5), 3) == 5
    assert ranks.max_over_ranks(TwoRanks(other=1), 3) == 3
    assert ranks.skip_together(TwoRanks(other=1), False) is True  # the other rank skips: this one does too
    assert ranks.skip_together(TwoRanks(other=0), False) is False
    assert ranks.skip_together(OneRank(), True) is True


def test_micro_batches_are_padded_to_the_most_any_rank_has():
    assert ranks.micro_batches(OneRank(), 5, 2) == [[0, 1], [2, 3], [4]]
    assert ranks.micro_batches(TwoRanks(other=4), 3, 2) == [[0, 1], [2], [], []]
    assert ranks.micro_batches(TwoRanks(other=1), 0, 2) == [[]]


def test_mean_over_ranks_skips_missing_and_non_finite(monkeypatch):
    m = {"loss": 1.0, "reward": 0.5}
    assert ranks.mean_over_ranks(OneRank(), m) is m
    monkeypatch.setattr(ranks, "gather_object", lambda rows: rows + [{"loss": float("nan"), "reward": 1.5, "x": 2.0}])
    out = ranks.mean_over_ranks(TwoRanks(other=0), m)
    assert out == {"loss": 1.0, "reward": 1.0, "x": 2.0}
    monkeypatch.setattr(ranks, "gather_object", lambda rows: [{"loss": float("inf")}, {"loss": float("nan")}])
    assert math.isnan(ranks.mean_over_ranks(TwoRanks(other=0), {})["loss"])


def test_rollout_log_appends_and_truncates(tmp_path):
    from dllm_rl.jsonl import read_jsonl

    log = RolloutLog(tmp_path / "rollouts.jsonl")
    log.log(1, [("p", "c", 1.0, "ok")])
    log.log(2, [("q", "d", 0.0, "wrong"), ("r", "e", 0.5, "partial")])
    log.log(3, [])
    rows = read_jsonl(tmp_path / "rollouts.jsonl")
    assert [(r["step"], r["prompt"], r["reward"], r["reason"]) for r in rows] == [
        (1, "p", 1.0, "ok"), (2, "q", 0.0, "wrong"), (2, "r", 0.5, "partial")]
    log.truncate(1)
    assert [r["step"] for r in read_jsonl(tmp_path / "rollouts.jsonl")] == [1]
    off = RolloutLog(tmp_path / "other.jsonl", enabled=False)
    off.log(1, [("p", "c", 1.0, "ok")])
    off.truncate(0)
    assert not (tmp_path / "other.jsonl").exists()
