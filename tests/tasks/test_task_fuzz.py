"""The fuzz corpus is deterministic and every non-code reward scores it in [0, 1] with a reason, never
raising and never waiting on a verifier timeout (the slowest call is measured by benchmarks/rewards.py)."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from dllm_rl.tasks import Score, get_task
from dllm_rl.tasks.fuzz import FAMILIES, FUZZ_ROWS, junk_completions


def digest(task: str, n: int, seed: int) -> str:
    h = hashlib.sha256()
    for family, text in junk_completions(task, n, seed):
        h.update(family.encode() + text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def test_corpus_is_deterministic_and_covers_every_family():
    assert digest("math", 18, 0) == digest("math", 18, 0)
    assert digest("math", 18, 0) != digest("math", 18, 1)
    assert digest("math", 18, 0) != digest("gsm8k", 18, 0)
    assert Counter(f for f, _ in junk_completions("code", 18)) == {f: 2 for f in FAMILIES}
    assert max(len(t) for _, t in junk_completions("sudoku", 36)) >= 1 << 20
    with pytest.raises(ValueError, match="no fuzz corpus for task 'arith'; choose one of gsm8k, math"):
        next(junk_completions("arith", 1))


@pytest.mark.parametrize("name", ["gsm8k", "math", "countdown", "sudoku"])
def test_fuzz_corpus_scores_in_unit_interval(name):
    task = get_task(name, data=[FUZZ_ROWS[name]])
    (ex,) = task.examples
    for family, text in junk_completions(name, 18, seed=3):
        (s,) = task.score_examples([text], [ex])
        assert isinstance(s, Score) and 0.0 <= s <= 1.0, (family, text[:60])
        assert s.reason, family
        assert "reward error" not in s.reason and "timeout" not in s.reason, (family, text[:60], s.reason)
