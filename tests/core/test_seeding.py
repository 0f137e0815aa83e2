"""derive_seed: the one seed derivation (the FNV-1a recurrence the RL trainer's streams have always used)."""

from dllm_rl.seeding import derive_seed


def test_derive_seed_values_are_pinned():
    # the RL trainer's rollout seed of (seed 0, step 1, rank 0, sample 3) and its step-1 estimator seed
    assert derive_seed() == 1469598103934665603
    assert derive_seed(0) == (1469598103934665603 * 1099511628211) % (1 << 63)
    assert derive_seed(0, 1, 0, 3) == 2930381696324482977
    assert derive_seed(0, 1, 7919) == 2968785089371588293


def test_derive_seed_is_63_bit_and_order_sensitive():
    seeds = {derive_seed(s, i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400 and all(0 <= x < (1 << 63) for x in seeds)
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(5 + (1 << 48)) == derive_seed(5)  # each part's low 48 bits
