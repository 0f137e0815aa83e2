"""One way to derive a seed from several integers: :func:`derive_seed`.

Every per-item stream of the RL trainer (a sample's rollout noise and estimator masks, a step's estimator
generator), of the in-memory held-out evaluation (item ``i``) and of ``dllm-rl eval`` (sample ``s`` of item
``i``) comes from ``derive_seed(seed, ...)`` of the integers that name it, so a stream depends only on what it
is the stream of (not on batching, ranks or the order of work), the same in every process and Python run (no
``hash()``, which is salted per process).

The SFT trainer's masks come from the same function: each example's from its position in the run's example
stream (``derive_seed(seed, position)``), so neither the rank nor the world size changes them.

One older mix is kept because measured numbers depend on it: the estimators' per-sample mask generators
(:class:`dllm_rl.estimators.rows.RowRandom`, a linear mix of the step's base and the sample seed: the RL demo's
measured gains). Python ``random.Random`` streams (synthetic tasks, fuzzing) are seeded by
strings naming them.
"""

from __future__ import annotations

_FNV_OFFSET = 1469598103934665603
_FNV_PRIME = 1099511628211

# Named tags of streams derived inside one RL step (their values are those of earlier versions: measured runs
# depend on them). ``derive_seed(seed, step, ESTIMATOR_MASKS)`` is the step's estimator generator;
# ``derive_seed(sample_seed, HOOK_ROLLOUTS)`` a rollout hook's regeneration of a sample.
ESTIMATOR_MASKS = 7919
HOOK_ROLLOUTS = 104729


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers: the 64-bit FNV-1a recurrence over the parts (each its low 48 bits),
    ``h = ((h ^ part) * 1099511628211) mod 2**63`` from ``h = 1469598103934665603`` (Fowler, Noll and Vo,
    "FNV hash", IETF draft-eastlake-fnv; one multiply per part instead of per byte).

    Deterministic across processes and Python runs, and distinct for different part tuples in practice.
    Torch generators take it as is (``torch.Generator().manual_seed(derive_seed(...))``).
    """
    h = _FNV_OFFSET
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * _FNV_PRIME) % (1 << 63)
    return h
