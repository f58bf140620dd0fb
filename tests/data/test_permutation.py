"""KeyedPermutation's quality: a bijection of [0, n) (every n up to a few
thousand, exhaustively; by sampling up to 2**64 - 1), uniform positions (a
chi-squared test), uncorrelated neighbours, independent keys; small
permutations (tables) uniform over all orders, odd ones as often as even
ones; ``[i]``, ``take`` and ``block`` agree; bad input is a clear error.

Every check is deterministic (fixed keys and positions), so the statistical
thresholds cannot flake: each is set at a tail probability of about 1e-4 for
a truly random permutation, and the permutation either passes or fails it
on every run."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from conveyor.sampler.permutation import MAX_LENGTH, TABLE_UP_TO, KeyedPermutation


def test_every_length_up_to_a_few_thousand_is_a_bijection():
    lengths = [(n, key) for key in (0, (1 << 64) - 1) for n in range(0, 1201)]
    lengths += [(n, 7) for n in range(1201, 5000, 13)]
    lengths += [(n, 9) for n in range(TABLE_UP_TO - 2, TABLE_UP_TO + 300)]  # (past it, the Feistel network)
    for n, key in lengths:
        indices = KeyedPermutation(n, key).block(0, n)
        assert np.array_equal(np.sort(indices), np.arange(n)), (n, key)


def test_lengths_around_powers_of_two_are_bijections():
    # The Feistel domain changes width at each even power of two; cycle walking is longest just above one.
    for bits in range(1, 22):
        for n in ((1 << bits) - 1, 1 << bits, (1 << bits) + 1):
            indices = KeyedPermutation(n, bits).block(0, n)
            assert np.array_equal(np.sort(indices), np.arange(n)), n


@pytest.mark.parametrize("n", [(1 << 32) + 15, 10**10, 10**12 + 3, 1 << 63, (1 << 63) + 1, MAX_LENGTH])
def test_large_lengths_map_distinct_positions_to_distinct_indices_below_n(n):
    rng = np.random.default_rng(5)
    positions = np.unique(rng.integers(0, n, size=20_000, dtype=np.uint64, endpoint=False))
    positions = np.concatenate([positions, np.array([0, n - 1], dtype=np.uint64)])
    for key in (3, 4):
        indices = KeyedPermutation(n, key).take(positions)
        assert len(np.unique(indices)) == len(np.unique(positions))  # injective on what was sampled
        assert int(indices.astype(np.uint64).max()) < n


def test_item_take_and_block_give_the_same_indices():
    for n in (1, 2, 3, 1000, (1 << 40) + 3, 1 << 63, MAX_LENGTH):
        permutation = KeyedPermutation(n, 99)
        count = min(n, 300)
        by_item = [permutation[i] for i in range(count)]
        assert permutation.take(np.arange(count)).tolist() == by_item
        assert permutation.block(0, count).tolist() == by_item
        last = [permutation[n - 1 - i] for i in range(count)]
        assert permutation.take(np.array([n - 1 - i for i in range(count)], dtype=np.uint64)).tolist() == last


def test_take_keeps_the_shape_and_maps_more_than_one_chunk():
    permutation = KeyedPermutation(10**9, 8)
    positions = np.arange(200_000).reshape(400, 500)  # (more than one chunk of the mapping)
    indices = permutation.take(positions)
    assert indices.shape == (400, 500) and indices.dtype == np.int64
    assert indices[399, 499] == permutation[199_999] and indices[0, 0] == permutation[0]
    assert np.array_equal(indices.ravel(), permutation.block(0, 200_000))


def test_indices_are_int64_up_to_2_to_the_63_and_uint64_past_it():
    assert KeyedPermutation(1 << 63, 1).take([0, 1]).dtype == np.int64
    assert KeyedPermutation((1 << 63) + 1, 1).take([0, 1]).dtype == np.uint64


def chi_squared(counts: np.ndarray) -> float:
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


#: chi-squared's value with 99 degrees of freedom that a random sample passes with probability 1 - 1e-4.
CHI2_99_TAIL = 157.0


@pytest.mark.parametrize("n", [(1 << 20) + 7, 10**10, MAX_LENGTH])
def test_the_first_positions_fall_uniformly_over_the_indices(n):
    indices = KeyedPermutation(n, 11).block(0, 100_000).astype(np.float64)
    counts = np.bincount(np.minimum((indices / n * 100).astype(np.int64), 99), minlength=100)
    assert chi_squared(counts) < CHI2_99_TAIL


def test_one_position_falls_uniformly_over_the_indices_across_keys():
    n = 1_000_003
    indices = np.array([KeyedPermutation(n, key)[12] for key in range(20_000)])
    counts = np.bincount(indices * 100 // n, minlength=100)
    assert chi_squared(counts) < CHI2_99_TAIL


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


#: |correlation| a random sample of 100 000 pairs stays under with probability 1 - 1e-4 (about 4 sigma).
CORRELATION_BOUND = 4 / np.sqrt(100_000)


@pytest.mark.parametrize("n", [100_001, (1 << 40) + 1, 10**10])
def test_neighbouring_positions_and_positions_and_indices_are_uncorrelated(n):
    indices = KeyedPermutation(n, 21).block(0, 100_001)
    assert abs(correlation(indices[:-1], indices[1:])) < CORRELATION_BOUND  # p[i] against p[i + 1]
    assert abs(correlation(np.arange(100_000), indices[:-1])) < CORRELATION_BOUND  # i against p[i]
    steps = np.diff(indices.astype(np.float64))
    assert abs(correlation(steps[:-1], steps[1:]) + 0.5) < CORRELATION_BOUND  # (a random order's steps: -1/2)


def test_neighbouring_keys_give_independent_permutations():
    n = 100_000
    base = KeyedPermutation(n, 1000).block(0, n)
    for key in (1001, 1000 ^ 1, 1000 + (1 << 32), 0):
        other = KeyedPermutation(n, key).block(0, n)
        # the same index at the same position: about once (a random pair: Poisson with mean 1)
        assert int((base == other).sum()) <= 8, key
        # rank correlation (the values are ranks: a permutation of 0..n-1)
        assert abs(correlation(base, other)) < 4 / np.sqrt(n), key


def test_agreement_between_keys_is_one_over_n():
    n = 1000
    orders = np.stack([KeyedPermutation(n, key).block(0, n) for key in range(200)])
    agreements = sum(int((orders[a] == orders[a + 1]).sum()) for a in range(199))
    assert 140 <= agreements <= 260  # 199 pairs, each about 1 (mean 199, sigma about 14)


def parity(order: np.ndarray) -> int:
    """0 for an even permutation, 1 for an odd one (n minus its number of cycles, mod 2)."""
    seen, cycles = np.zeros(len(order), dtype=bool), 0
    for start in range(len(order)):
        if not seen[start]:
            cycles += 1
            at = start
            while not seen[at]:
                seen[at], at = True, int(order[at])
    return (len(order) - cycles) % 2


@pytest.mark.parametrize("n", [16, 64, 256, 9])
def test_small_permutations_are_odd_as_often_as_even(n):
    # (a Feistel network over 4 bits or more composes even permutations only: alone, it never gives an odd one)
    odd = sum(parity(KeyedPermutation(n, key).block(0, n)) for key in range(2000))
    assert abs(odd - 1000) < 4 * np.sqrt(500)  # (a random permutation is odd with probability 1/2)


#: chi-squared's value with (n - 1)**2 degrees of freedom that a random table passes with probability 1 - 1e-4.
CHI2_TAIL_OF_TABLE = {5: 46.2, 6: 60.4}


@pytest.mark.parametrize("n", [5, 6])
def test_every_index_is_as_likely_at_every_position_of_a_small_permutation(n):
    counts = np.zeros((n, n))
    for key in range(20_000):
        counts[np.arange(n), KeyedPermutation(n, key).block(0, n)] += 1
    assert chi_squared(counts.ravel()) < CHI2_TAIL_OF_TABLE[n]


def test_a_small_permutation_reaches_every_order_about_as_often():
    orders = {tuple(KeyedPermutation(8, key).block(0, 8).tolist()) for key in range(20_000)}
    expected = 40320 * (1 - np.exp(-20_000 / 40320))  # distinct orders among 20 000 uniform draws: about 15 800
    assert len(orders) > expected - 400


def test_a_permutation_is_a_value():
    permutation = KeyedPermutation(10**10, 5)
    assert pickle.loads(pickle.dumps(permutation)) == permutation
    assert pickle.loads(pickle.dumps(permutation))[17] == permutation[17]
    assert KeyedPermutation(10**10, 6) != permutation and len(permutation) == 10**10
    assert KeyedPermutation(5, -1).key == (1 << 64) - 1  # keys are taken modulo 2**64


def test_len_past_sys_maxsize_points_at_n():
    permutation = KeyedPermutation(MAX_LENGTH, 1)
    with pytest.raises(OverflowError, match="its n attribute"):
        len(permutation)
    assert permutation.n == MAX_LENGTH and permutation[MAX_LENGTH - 1] < MAX_LENGTH


def test_negative_items_count_from_the_end():
    permutation = KeyedPermutation(10, 3)
    assert permutation[-1] == permutation[9]


@pytest.mark.parametrize(
    "n, error, words",
    [
        (-1, ValueError, "2**64 - 1"),
        (1 << 64, ValueError, "2**64 - 1"),
        (10.0, TypeError, "int"),
        (True, TypeError, "int"),
        ("10", TypeError, "int"),
    ],
)
def test_a_bad_length_is_refused(n, error, words):
    with pytest.raises(error, match=words.replace("*", r"\*")):
        KeyedPermutation(n, 0)


def test_a_bad_key_is_refused():
    with pytest.raises(TypeError, match="key must be an int"):
        KeyedPermutation(10, 1.5)


def test_positions_outside_the_permutation_are_refused():
    permutation = KeyedPermutation(10, 3)
    with pytest.raises(IndexError, match="outside a permutation of 10"):
        permutation[10]
    with pytest.raises(IndexError, match="outside a permutation of 10"):
        permutation[-11]
    with pytest.raises(IndexError, match="outside a permutation of 10"):
        permutation.take([3, 10])
    with pytest.raises(IndexError, match="outside a permutation of 10"):
        permutation.take([-1])
    with pytest.raises(IndexError, match="not inside a permutation of 10"):
        permutation.block(5, 11)
    with pytest.raises(IndexError, match="not inside a permutation of 10"):
        permutation.block(6, 5)
    with pytest.raises(TypeError, match="ints"):
        permutation[1.0]
    with pytest.raises(TypeError, match="ints"):
        permutation.take([1.5])
    with pytest.raises(TypeError, match="ints"):
        permutation.block(0, 2.0)
    assert KeyedPermutation(0, 1).take([]).tolist() == [] and KeyedPermutation(0, 1).block(0, 0).tolist() == []
