"""Unbiased pass@k (Chen et al. 2021, Eq. 1) on hand-computed cases and a fixed results file."""

from __future__ import annotations

from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from dllm_rl.eval.passk import default_ks, pass_at_k, pass_at_k_from_file, pass_at_k_from_records

FIXTURE = Path(__file__).parent / "fixtures" / "passk_results.jsonl"


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # only 3 wrong samples: any 4 contain a correct one
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    ],
)
def test_pass_at_k_hand_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(200, 13, 100), (200, 1, 10), (64, 7, 16), (30, 29, 1), (50, 3, 47)])
def test_pass_at_k_matches_exact_binomials(n, c, k):
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-10, abs=1e-12)


def test_pass_at_1_is_fraction_correct():
    for n in (1, 3, 8):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_default_ks():
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(6) == [1, 2, 4, 6]


def test_pass_at_k_from_fixed_results_file():
    # items: [1,0,0,1] (c=2), [0,0,0,0] (c=0), [1,1,1,0] (c=3); n=4, records shuffled in the file
    got = pass_at_k_from_file(FIXTURE)
    assert set(got) == {1, 2, 4}
    assert got[1] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)  # 5/12
    assert got[2] == pytest.approx((5 / 6 + 0 + 1) / 3)  # item 0: 1 - C(2,2)/C(4,2) = 5/6; item 2: 1
    assert got[4] == pytest.approx(2 / 3)
    assert pass_at_k_from_file(FIXTURE, ks=[3])[3] == pytest.approx((1 + 0 + 1) / 3)  # item 0: 1 - C(2,3)=0 -> 1


def test_pass_at_k_needs_equal_samples_per_item():
    recs = [{"index": 0, "correct": True}, {"index": 0, "correct": False}, {"index": 1, "correct": True}]
    with pytest.raises(ValueError, match="different numbers of samples"):
        pass_at_k_from_records(recs)
