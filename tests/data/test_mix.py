"""conveyor.Mix: every prefix within one sample per source of its share,
each source read once per epoch in its own permutation, the order equal to
a slow simulation, schedules of weights, stopping rules, samplers, workers
and bad input."""

from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
from conveyor.rng import derive_seed
from conveyor.sampler.permutation import KeyedPermutation


def _sources(lengths):
    return {name: list(range(1000 * s, 1000 * s + n)) for s, (name, n) in enumerate(lengths.items())}


def _prefix_counts(sources: np.ndarray, n: int) -> np.ndarray:
    """counts[p, s]: samples of source s among the first p + 1 positions."""
    return np.cumsum(sources[:, None] == np.arange(n)[None, :], axis=0)


def _assert_within_one(mix: conveyor.Mix, positions: int) -> None:
    sources, _ = mix.locate_many(np.arange(positions))
    counts = _prefix_counts(sources, len(mix.names))
    shares = np.array([mix.shares[name] for name in mix.names])
    p = np.arange(1, positions + 1)[:, None]
    assert np.abs(counts - p * shares).max() <= 1.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=2, max_size=30).filter(any))
def test_every_prefix_is_within_one_sample_per_source_of_its_share(weights):
    names = [f"s{i}" for i in range(len(weights))]
    mix = conveyor.Mix({n: [0] for n in names}, weights=dict(zip(names, weights)), num_samples=10**9)
    total = sum(weights)
    assert mix.shares == {n: float(Fraction(w, total)) for n, w in zip(names, weights)}  # exact: integer weights
    _assert_within_one(mix, min(2 * total, 3000) + 7)


@settings(max_examples=2, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=30).filter(lambda w: sum(w) > 1e-3))
def test_arbitrary_float_weights_are_realised_within_2_to_the_minus_20(weights):
    names = [f"s{i}" for i in range(len(weights))]
    mix = conveyor.Mix({n: [0] for n in names}, weights=dict(zip(names, weights)), num_samples=10**12)
    total = math.fsum(weights)
    for name, w in zip(names, weights):
        assert abs(mix.shares[name] - w / total) <= 2**-20 * len(weights)
        assert (mix.shares[name] > 0) == (w > 0)
    _assert_within_one(mix, 5000)
    # Far into the mix too: counts at any prefix stay within one of the share.
    for p in (10**11 + 12345, 10**12):
        counts = mix.counts(p)
        assert all(abs(counts[n] - p * mix.shares[n]) < 1 for n in names)


def test_weights_near_the_largest_float_are_mixed_by_their_ratio():
    # (exact ints, so no simple fraction: the shares are rounded, and the weights' sum is past the largest float)
    sources = {"a": [1], "b": [2], "c": [3], "d": [4]}
    mix = conveyor.Mix(sources, weights={"a": 1e308, "b": 1.7e308, "c": 0.0, "d": 1e-300}, num_samples=8)
    assert abs(mix.shares["a"] - 1 / 2.7) <= 2**-20 * 4 and mix.shares["c"] == 0
    assert mix.shares["d"] == 2**-20  # (a positive weight keeps one position per period)
    with pytest.raises(ValueError, match=r"weights\['a'\] is an int too large for a float"):
        conveyor.Mix({"a": [1], "b": [2]}, weights={"a": 10**400, "b": 1}, num_samples=8)


def _reference(lengths, weights, seed, num_samples):
    """The mix simulated position by position: each position takes, of the
    sources whose next sample is released, the one with the earliest
    deadline (exact fractions), then that source's permutation of its epoch."""
    names = list(lengths)
    total = sum(weights.values())
    shares = {n: Fraction(weights[n], total) for n in names}
    counts = dict.fromkeys(names, 0)
    out = []
    for t in range(1, num_samples + 1):
        ready = []
        for s, n in enumerate(names):
            if shares[n] == 0:
                continue
            k = counts[n] + 1
            release = math.floor((k - 1) / shares[n]) + 1
            deadline = math.ceil(k / shares[n])
            if release <= t:
                ready.append((deadline, s, n))
        deadline, _, name = min(ready)
        assert deadline >= t
        epoch, within = divmod(counts[name], lengths[name])
        permutation = KeyedPermutation(lengths[name], derive_seed(seed, zlib.crc32(name.encode()), epoch))
        out.append((name, permutation[within]))
        counts[name] += 1
    return out


def test_the_map_equals_a_slow_simulation():
    lengths = {"web": 11, "code": 5, "books": 3}
    weights = {"web": 5, "code": 2, "books": 1}
    mix = conveyor.Mix(_sources(lengths), weights=weights, seed=7, num_samples=90)
    assert [mix.locate(p) for p in range(90)] == _reference(lengths, weights, 7, 90)
    names, indices = mix.locate_many(np.arange(90))
    assert [(mix.names[s], int(i)) for s, i in zip(names, indices)] == _reference(lengths, weights, 7, 90)


def test_each_source_is_read_once_per_epoch_in_a_new_order():
    lengths = {"big": 40, "small": 7, "tiny": 3}
    mix = conveyor.Mix(_sources(lengths), weights={"big": 2, "small": 2, "tiny": 1}, seed=3, num_samples=400)
    seen: dict[str, list[int]] = {n: [] for n in lengths}
    for p in range(len(mix)):
        name, index = mix.locate(p)
        seen[name].append(index)
    for name, n in lengths.items():
        epochs = [seen[name][i : i + n] for i in range(0, len(seen[name]) - n + 1, n)]
        assert len(epochs) >= 2
        assert all(sorted(epoch) == list(range(n)) for epoch in epochs)
        assert len({tuple(epoch) for epoch in epochs}) > 1 or n <= 3  # a new permutation each epoch
    assert [mix[p] for p in range(5)] == mix.__getitems__(list(range(5)))


def test_without_shuffle_each_source_is_read_in_its_own_order():
    mix = conveyor.Mix({"a": [0, 1, 2], "b": [10, 11]}, weights={"a": 1, "b": 1}, shuffle=False, num_samples=10)
    assert [x for x in (mix[p] for p in range(10)) if x < 10] == [0, 1, 2, 0, 1]


def test_stopping_rules():
    sources = {"a": list(range(10)), "b": list(range(100, 104))}
    first = conveyor.Mix(sources, weights={"a": 1, "b": 1})  # stop="first" by default
    assert first.stop == "first" and len(first) == 8  # b runs out at its 4th sample (a, b, a, b, ...)
    assert first.counts(len(first)) == {"a": 4, "b": 4}
    every = conveyor.Mix(sources, weights={"a": 1, "b": 1}, stop="all")
    assert len(every) == 19 and every.counts(len(every)) == {"a": 10, "b": 9}
    assert every.report(len(every))["b"].epoch == 2
    never = conveyor.Mix(sources, weights={"a": 1, "b": 1}, num_samples=1000)
    assert never.stop == "never" and len(never) == 1000
    default_weights = conveyor.Mix(sources, stop="all")  # proportional to the lengths: one epoch of each
    assert len(default_weights) == 14 and default_weights.counts(14) == {"a": 10, "b": 4}


def test_a_weight_schedule_keeps_each_sources_epochs_whole():
    lengths = {"web": 13, "code": 6}
    steps = [(0, {"web": 3, "code": 1}), (17, {"web": 1, "code": 3}), (41, {"web": 1, "code": 0})]
    mix = conveyor.Mix(_sources(lengths), weights=steps, seed=1, num_samples=120)
    seen: dict[str, list[int]] = {n: [] for n in lengths}
    for p in range(len(mix)):
        name, index = mix.locate(p)
        seen[name].append(index)
    for name, n in lengths.items():
        whole = len(seen[name]) // n * n
        assert all(sorted(seen[name][i : i + n]) == list(range(n)) for i in range(0, whole, n))
    assert len(seen["code"]) == mix.counts(41)["code"]  # weight 0 from position 41 on
    # Inside each block, its prefixes are within one sample of that block's shares.
    sources, _ = mix.locate_many(np.arange(120))
    for start, end, shares in ((0, 17, (0.75, 0.25)), (17, 41, (0.25, 0.75))):
        counts = _prefix_counts(sources[start:end], 2)
        assert np.abs(counts - np.arange(1, end - start + 1)[:, None] * np.array(shares)).max() <= 1
    function = conveyor.Mix(
        _sources(lengths),
        weights=lambda p: steps[0][1] if p < 20 else steps[1][1],
        schedule_every=10,
        seed=1,
        num_samples=60,
    )
    listed = conveyor.Mix(_sources(lengths), weights=[(0, steps[0][1]), (20, steps[1][1])], seed=1, num_samples=60)
    assert [function.locate(p) for p in range(60)] == [listed.locate(p) for p in range(60)]
    report = mix.report(41)
    assert report["web"].served + report["code"].served == 41
    assert abs(report["code"].target - (17 * 0.25 + 24 * 0.75)) < 1e-9


def test_the_map_is_the_same_in_any_order_of_reads():
    mix = conveyor.Mix(
        _sources({"a": 50, "b": 20}), weights=[(0, {"a": 1, "b": 1}), (30, {"a": 4, "b": 1})], num_samples=200
    )
    forwards = [mix.locate(p) for p in range(200)]
    fresh = conveyor.Mix(
        _sources({"a": 50, "b": 20}), weights=[(0, {"a": 1, "b": 1}), (30, {"a": 4, "b": 1})], num_samples=200
    )
    assert [fresh.locate(p) for p in reversed(range(200))] == forwards[::-1]


@pytest.mark.parametrize("workers", [(0, "multiprocessing"), (2, "multiprocessing"), (2, "thread")])
def test_same_batches_for_any_workers(workers):
    num_workers, method = workers
    mix = conveyor.Mix(_sources({"a": 30, "b": 9, "c": 4}), weights={"a": 5, "b": 3, "c": 2}, num_samples=64)
    loader = conveyor.DataLoader(mix, batch_size=8, shuffle=True, seed=5, num_workers=num_workers, worker_method=method)
    batches = [b.tolist() for b in loader]
    expected = [[mix[p] for p in batch] for batch in conveyor.DataLoader(range(64), batch_size=8, shuffle=True, seed=5)]
    assert batches == expected


@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_sampler_over_a_mix_serves_every_position_once(ranks):
    mix = conveyor.Mix(_sources({"a": 30, "b": 9}), weights={"a": 2, "b": 1}, num_samples=60)
    served = []
    for rank in range(ranks):
        sampler = conveyor.DistributedSampler(mix, num_replicas=ranks, rank=rank, shuffle=True, seed=2, drop_last=True)
        served += list(sampler)
    assert len(served) == len(set(served)) == 60 // ranks * ranks


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"weights": {"a": -1, "b": 1}}, ValueError, "'a'] is -1.0; weights must be >= 0"),
        ({"weights": {"a": 0, "b": 0}}, ValueError, "all zero"),
        ({"weights": {"a": float("nan"), "b": 1}}, ValueError, "nan"),
        ({"weights": {"a": float("inf"), "b": 1}}, ValueError, "inf"),
        ({"weights": {"a": 1, "b": 1, "c": 1}}, ValueError, "sources the mix does not have: ['c']"),
        ({"weights": {"a": 1}}, ValueError, "no weight for the sources ['b']"),
        ({"weights": {"a": "1", "b": 1}}, TypeError, "must be a number"),
        ({"weights": [(5, {"a": 1, "b": 1})]}, ValueError, "first step must start at position 0"),
        ({"weights": lambda p: {"a": 1, "b": 1}}, ValueError, "schedule_every"),
        ({"weights": lambda p: {"a": -1, "b": 1}, "schedule_every": 4}, ValueError, "weights(0)['a']"),
        # (positions past 2**63 - 1 do not fit the int64 positions a batch is looked up by)
        ({"weights": [(0, {"a": 1, "b": 1}), (2**63, {"a": 1, "b": 2})]}, ValueError, "[0, 2**63 - 1]"),
        ({"weights": lambda p: {"a": 1, "b": 1}, "schedule_every": 2**63}, ValueError, "[1, 2**63 - 1]"),
        ({"num_samples": -1}, ValueError, "num_samples must be in [0, 2**63 - 1]"),
        ({"num_samples": 2**64}, ValueError, "below 2**64"),
        ({"num_samples": 1.5}, TypeError, "num_samples must be an int"),
        ({"stop": "never"}, ValueError, "needs num_samples="),
        ({"stop": "first", "num_samples": 4}, ValueError, "not both"),
        ({"stop": "sometimes"}, ValueError, "stop must be one of"),
        ({"weights": {"a": 1, "b": 0}, "stop": "all", "num_samples": None}, None, None),
    ],
)
def test_bad_input_is_refused_at_construction(kwargs, error, words):
    sources = {"a": [1, 2, 3], "b": [4, 5]}
    if error is None:
        assert len(conveyor.Mix(sources, **kwargs)) == 3  # a source of weight 0 is never read, nor waited for
        return
    with pytest.raises(error) as raised:
        conveyor.Mix(sources, **kwargs)
    assert words in str(raised.value)


def test_bad_sources_are_refused_at_construction():
    with pytest.raises(TypeError, match="sources must be a mapping"):
        conveyor.Mix([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"the sources \['b'\] have no samples"):
        conveyor.Mix({"a": [1], "b": []})
    with pytest.raises(ValueError, match="sources is empty"):
        conveyor.Mix({})
    with pytest.raises(TypeError, match="not a map-style dataset"):
        conveyor.Mix({"a": [1], "b": iter([1, 2])})
    with pytest.raises(ValueError, match="never ends"):
        conveyor.Mix({"a": [1, 2], "b": [3]}, weights=[(0, {"a": 1, "b": 1}), (1, {"a": 1, "b": 0})], stop="all")


@pytest.mark.timeout(20)
def test_stop_first_with_a_function_schedule_does_not_wait_for_a_source_never_read():
    # ("b" is never read: its end is never reached, and the mix ends where "a" runs out)
    mix = conveyor.Mix({"a": [1, 2, 3], "b": [4, 5]}, weights=lambda p: {"a": 1, "b": 0}, schedule_every=100)
    assert len(mix) == 3 and mix.counts(3) == {"a": 3, "b": 0}
    late = conveyor.Mix(
        {"a": [1, 2, 3], "b": [4, 5]}, weights=lambda p: {"a": 1, "b": float(p >= 10**6)}, schedule_every=10
    )
    assert len(late) == 3


def _ramp(position):
    return {"a": 1.0, "b": 0.37 + position / 300, "c": 0.05}


@pytest.mark.parametrize("workers", [(2, "multiprocessing"), (2, "thread")])
def test_a_function_schedule_gives_the_same_batches_in_workers(workers):
    num_workers, method = workers
    mix = conveyor.Mix(_sources({"a": 30, "b": 9, "c": 4}), weights=_ramp, schedule_every=16, num_samples=96)
    expected = [[mix[p] for p in batch] for batch in conveyor.DataLoader(range(96), batch_size=8, shuffle=True, seed=4)]
    fresh = conveyor.Mix(_sources({"a": 30, "b": 9, "c": 4}), weights=_ramp, schedule_every=16, num_samples=96)
    loader = conveyor.DataLoader(
        fresh, batch_size=8, shuffle=True, seed=4, num_workers=num_workers, worker_method=method
    )
    assert [b.tolist() for b in loader] == expected


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 60), st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(any)),
        min_size=1,
        max_size=5,
    )
)
def test_each_block_of_a_schedule_keeps_its_prefixes_within_one_sample(steps):
    starts, position = [], 0
    for length, _ in steps:
        starts.append(position)
        position += length
    weights = [(start, dict(zip("abc", w))) for start, (_, w) in zip(starts, steps)]
    mix = conveyor.Mix(_sources({"a": 7, "b": 5, "c": 3}), weights=weights, num_samples=position)
    sources, _ = mix.locate_many(np.arange(position))
    runs: list[list] = []  # (steps of equal weights one after another are one block of constant weights)
    for start, (length, w) in zip(starts, steps):
        if runs and runs[-1][2] == w:
            runs[-1][1] += length
        else:
            runs.append([start, length, w])
    for start, length, w in runs:
        counts = _prefix_counts(sources[start : start + length], 3)
        shares = np.array(w) / sum(w)
        assert np.abs(counts - np.arange(1, length + 1)[:, None] * shares).max() < 1
    # And each source's epochs stay whole across the changes.
    for s, n in enumerate((7, 5, 3)):
        _, indices = mix.locate_many(np.flatnonzero(sources == s))
        whole = len(indices) // n * n
        assert all(sorted(indices[i : i + n].tolist()) == list(range(n)) for i in range(0, whole, n))


def test_steps_and_blocks_up_to_the_last_int64_position_are_read_in_batches():
    sources = {"a": [1, 2, 3], "b": [4, 5]}
    last = 2**63 - 1
    for kwargs in (
        {"weights": [(0, {"a": 1, "b": 1}), (last, {"a": 1, "b": 2})]},
        {"weights": lambda p: {"a": 1, "b": 1}, "schedule_every": last},
    ):
        mix = conveyor.Mix(sources, num_samples=6, **kwargs)
        assert mix.__getitems__([0, 1, 2, 3]) == [mix[0], mix[1], mix[2], mix[3]]


def test_positions_outside_the_mix_and_bad_prefixes_are_refused():
    mix = conveyor.Mix({"a": [1, 2, 3], "b": [4, 5]}, weights={"a": 1, "b": 1}, num_samples=10)
    assert mix[-1] == mix[9]
    with pytest.raises(IndexError, match="outside the mix's 10 positions"):
        mix[10]
    with pytest.raises(IndexError, match="outside the mix's 10 positions"):
        mix.__getitems__([0, 11])
    # A batch's positions are ints, as one position is: none truncated (1.5 read 1), none wrapped (2**64 - 1 read 9).
    with pytest.raises(TypeError, match="positions must be ints, got an array of float64"):
        mix.__getitems__([1.5, 2])
    with pytest.raises(IndexError, match="outside the mix's 10 positions"):
        mix.locate_many(np.array([2**64 - 1], dtype=np.uint64))
    assert mix.locate_many(np.array([9], dtype=np.uint64))[1].tolist() == [mix.locate_many([9])[1][0]]
    assert mix.__getitems__([]) == []
    with pytest.raises(ValueError, match=r"a position in \[0, 10\]"):
        mix.report(11)
    assert mix.report(0)["a"].served == 0 and mix.report(10)["a"].target == 5.0
