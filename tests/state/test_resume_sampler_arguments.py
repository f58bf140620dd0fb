"""A state is refused by a loader whose sampler cannot reproduce its order
(issue 32, item 8): a sampler's arguments that shape its order (weights,
indices, lengths, num_samples, replacement, batch size, seed, ...) are part
of what its state records and checks, also when a change keeps the count,
for conveyor's samplers and torch's own used with ``conveyor.torch``.

Each case saves a state after two batches of an epoch; loaded into a loader
whose sampler has one such argument changed, it is refused at
``load_state_dict`` (not later, not silently) by an error that names the
sampler and the argument, shows both sides and says the fix; loaded into a
loader built the same way, the rest of the epoch is the uninterrupted run's.
No workers: what is checked is decided in the main process.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
import conveyor.torch as ct
from conveyor.sampler.fingerprint import values_crc32
from resume_helpers import json_round_trip

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

N = 20
DATA = list(range(N))
WEIGHTS = [1.0 + (i % 5) for i in range(N)]
#: The same count of weights, one of them other.
OTHER_WEIGHTS = WEIGHTS[:-1] + [9.0]
INDICES = list(range(0, 2 * N, 2))
#: The same count of indices, one of them other.
OTHER_INDICES = INDICES[:-1] + [1]
#: Shards of 4, 5, 3 and 8 samples (a ShardDataset's firsts), and as many samples in as many shards of other sizes.
SHARDS = SimpleNamespace(firsts=[0, 4, 9, 12, 20])
OTHER_SHARDS = SimpleNamespace(firsts=[0, 4, 8, 12, 20])


def _torch_gen():
    return torch.Generator().manual_seed(3)


def _numpy_gen():
    return np.random.default_rng(3)


def _loader(sampler=None, batch_sampler=None, batch_size=3, module=ct):
    data = list(range(2 * N))
    if batch_sampler is not None:
        return module.DataLoader(data, batch_sampler=batch_sampler)
    return module.DataLoader(data, batch_size=batch_size, sampler=sampler)


# name: (make(changed) -> a loader, the argument's key in the error, the sampler's class in the error)
CASES = {
    "conveyor WeightedRandomSampler, weights": (
        lambda changed: _loader(
            conveyor.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, N, generator=_numpy_gen()),
            module=conveyor,
        ),
        "weights_crc32",
        "WeightedRandomSampler",
    ),
    "conveyor WeightedRandomSampler without replacement, weights": (
        lambda changed: _loader(
            conveyor.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, 12, False, generator=_numpy_gen()),
            module=conveyor,
        ),
        "weights_crc32",
        "WeightedRandomSampler",
    ),
    "conveyor SubsetRandomSampler, indices": (
        lambda changed: _loader(
            conveyor.SubsetRandomSampler(OTHER_INDICES if changed else INDICES, generator=_numpy_gen()), module=conveyor
        ),
        "indices_crc32",
        "SubsetRandomSampler",
    ),
    "conveyor BatchSampler over a SubsetRandomSampler, indices": (
        lambda changed: _loader(
            batch_sampler=conveyor.BatchSampler(
                conveyor.SubsetRandomSampler(OTHER_INDICES if changed else INDICES, generator=_numpy_gen()), 3, False
            ),
            module=conveyor,
        ),
        "indices_crc32",
        "SubsetRandomSampler",
    ),
    "conveyor ShardedSampler over a WeightedRandomSampler, weights": (
        lambda changed: _loader(
            conveyor.ShardedSampler(
                conveyor.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, N, generator=_numpy_gen()),
                num_replicas=2,
                rank=1,
            ),
            batch_size=2,
            module=conveyor,
        ),
        "weights_crc32",
        "WeightedRandomSampler",
    ),
    "conveyor ShardBlockSampler, shards_per_window": (
        lambda changed: _loader(conveyor.ShardBlockSampler(SHARDS, 3 if changed else 2, seed=1), module=conveyor),
        "shards_per_window",
        "ShardBlockSampler",
    ),
    "conveyor ShardBlockSampler, shard sizes": (
        lambda changed: _loader(conveyor.ShardBlockSampler(OTHER_SHARDS if changed else SHARDS, 2), module=conveyor),
        "shard_sizes_crc32",
        "ShardBlockSampler",
    ),
    "conveyor RandomSampler, order": (
        lambda changed: _loader(
            conveyor.RandomSampler(DATA, generator=_numpy_gen(), order="stored" if changed else "computed"),
            module=conveyor,
        ),
        "order",
        "RandomSampler",
    ),
    "conveyor BatchSampler over a DistributedSampler, order": (
        lambda changed: _loader(
            batch_sampler=conveyor.BatchSampler(
                conveyor.DistributedSampler(DATA, 2, 1, seed=4, order="computed" if changed else "stored"), 3, False
            ),
            module=conveyor,
        ),
        "order",
        "DistributedSampler",
    ),
    "conveyor.torch WeightedRandomSampler, weights": (
        lambda changed: _loader(
            ct.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, N, generator=_torch_gen())
        ),
        "weights_crc32",
        "WeightedRandomSampler",
    ),
    "conveyor.torch SubsetRandomSampler, indices": (
        lambda changed: _loader(ct.SubsetRandomSampler(OTHER_INDICES if changed else INDICES, generator=_torch_gen())),
        "indices_crc32",
        "SubsetRandomSampler",
    ),
    "torch's WeightedRandomSampler, weights": (
        lambda changed: _loader(
            tud.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, N, generator=_torch_gen())
        ),
        "WeightedRandomSampler.weights_crc32",
        "WeightedRandomSampler",
    ),
    "torch's WeightedRandomSampler, num_samples": (
        lambda changed: _loader(tud.WeightedRandomSampler(WEIGHTS, N + 6 if changed else N, generator=_torch_gen())),
        "WeightedRandomSampler.num_samples",
        "WeightedRandomSampler",
    ),
    "torch's SubsetRandomSampler, indices": (
        lambda changed: _loader(tud.SubsetRandomSampler(OTHER_INDICES if changed else INDICES, generator=_torch_gen())),
        "SubsetRandomSampler.indices_crc32",
        "SubsetRandomSampler",
    ),
    "torch's RandomSampler, num_samples": (
        lambda changed: _loader(
            tud.RandomSampler(DATA, replacement=True, num_samples=N + 6 if changed else N, generator=_torch_gen())
        ),
        "RandomSampler.num_samples",
        "RandomSampler",
    ),
    "torch's RandomSampler, replacement": (
        lambda changed: _loader(tud.RandomSampler(DATA, replacement=changed, generator=_torch_gen())),
        "RandomSampler.replacement",
        "RandomSampler",
    ),
    "torch's BatchSampler, batch_size": (
        lambda changed: _loader(
            batch_sampler=tud.BatchSampler(tud.RandomSampler(DATA, generator=_torch_gen()), 4 if changed else 3, False)
        ),
        "BatchSampler.batch_size",
        "BatchSampler",
    ),
    "torch's BatchSampler over its WeightedRandomSampler, weights": (
        lambda changed: _loader(
            batch_sampler=tud.BatchSampler(
                tud.WeightedRandomSampler(OTHER_WEIGHTS if changed else WEIGHTS, N, generator=_torch_gen()), 3, False
            )
        ),
        "WeightedRandomSampler.weights_crc32",
        "WeightedRandomSampler",
    ),
    "torch's DistributedSampler, seed": (
        lambda changed: _loader(tud.DistributedSampler(DATA, num_replicas=2, rank=0, seed=1 if changed else 0)),
        "DistributedSampler.seed",
        "DistributedSampler",
    ),
}


def _batches(iterator):
    return [batch.tolist() for batch in iterator]


def _saved_after_two_batches(make):
    """A state saved after two batches of epoch 1 (through JSON) and the
    rest of that epoch in the uninterrupted run."""
    loader = make(False)
    _batches(loader)  # epoch 0
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = json_round_trip(loader.state_dict())
    return state, _batches(iterator)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_state_is_refused_by_a_sampler_with_another_order_and_resumes_in_one_built_the_same(case):
    make, key, sampler = CASES[case]
    state, rest = _saved_after_two_batches(make)

    with pytest.raises(ValueError) as refused:
        make(True).load_state_dict(state)
    message = str(refused.value)
    assert f"{sampler}" in message and key in message
    saved_line, this_line = (line for line in message.splitlines() if f"{key}=" in line)
    assert saved_line.lstrip().startswith("saved state:") and this_line.lstrip().startswith("this ")
    assert saved_line.split(f"{key}=")[1] != this_line.split(f"{key}=")[1]  # (both sides, and they differ)
    assert "Fix:" in message and "same dataset and arguments" in message

    resumed = make(False)
    resumed.load_state_dict(state)
    assert _batches(resumed) == rest


@pytest.mark.timeout(60)
def test_a_refused_state_leaves_the_loader_as_it_was():
    make, _, _ = CASES["conveyor.torch WeightedRandomSampler, weights"]
    state, _ = _saved_after_two_batches(make)
    other = make(True)
    before = other.state_dict()
    with pytest.raises(ValueError, match="weights_crc32"):
        other.load_state_dict(state)
    assert other.state_dict() == before


def test_a_state_saved_before_the_fingerprints_loads_and_resumes():
    """A sampler state without its arguments' fingerprint (written by
    conveyor before they were recorded) is accepted: nothing to check the
    values by, and the count and the other settings are still checked."""
    sampler = conveyor.WeightedRandomSampler(WEIGHTS, N, generator=_numpy_gen())
    iterator = iter(sampler)
    [next(iterator) for _ in range(5)]
    state = json_round_trip(sampler.state_dict())
    rest = list(iterator)
    old = {key: value for key, value in state.items() if key != "weights_crc32"}
    resumed = conveyor.WeightedRandomSampler(OTHER_WEIGHTS, N, generator=_numpy_gen())
    resumed.load_state_dict(old)  # (accepted: the old state cannot tell)
    same = conveyor.WeightedRandomSampler(WEIGHTS, N, generator=_numpy_gen())
    same.load_state_dict(old)
    assert list(same) == rest
    with pytest.raises(ValueError, match="num_weights"):
        conveyor.WeightedRandomSampler(WEIGHTS + [1.0], N, generator=_numpy_gen()).load_state_dict(old)


@pytest.mark.parametrize("make", [conveyor.WeightedRandomSampler, tud.WeightedRandomSampler], ids=["conveyor", "torch"])
def test_the_state_holds_a_fingerprint_not_the_weights(make):
    """100,000 weights: the loader's state stays small (a fingerprint of a
    few digits, not an array the size of the data set)."""
    weights = np.linspace(0.5, 1.0, 100_000)
    loader = conveyor.torch.DataLoader(range(100_000), batch_size=4, sampler=make(weights, 64, generator=_torch_gen()))
    next(iter(loader))
    assert len(json.dumps(loader.state_dict())) < 40_000  # (a torch.Generator's state is most of it)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100.0), min_size=2, max_size=30),
    where=st.integers(0, 29),
    other=st.floats(0.01, 100.0),
    position=st.integers(0, 8),
)
def test_any_changed_weight_is_refused_and_the_same_weights_in_any_container_load(weights, where, other, position):
    where %= len(weights)
    sampler = conveyor.WeightedRandomSampler(weights, 8, generator=_numpy_gen())
    iterator = iter(sampler)
    [next(iterator) for _ in range(position)]
    state = json_round_trip(sampler.state_dict())
    rest = list(iterator)
    changed = weights[:where] + [other] + weights[where + 1 :]
    if changed != weights:
        with pytest.raises(ValueError, match="weights_crc32"):
            conveyor.WeightedRandomSampler(changed, 8, generator=_numpy_gen()).load_state_dict(state)
    for same in (np.array(weights), tuple(weights), torch.tensor(weights, dtype=torch.float64)):
        resumed = conveyor.WeightedRandomSampler(same, 8, generator=_numpy_gen())
        resumed.load_state_dict(state)
        assert list(resumed) == rest


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 1000), st.integers(0, 50), st.integers(1, 4))
def test_the_same_indices_have_the_same_fingerprint_whatever_holds_them(start, count, step):
    indices = range(start, start + count * step, step)
    crc32 = values_crc32(indices)
    assert crc32 == values_crc32(list(indices)) == values_crc32(np.array(list(indices), dtype=np.int32))
    assert crc32 == values_crc32(torch.tensor(list(indices), dtype=torch.int64))
    if count:
        assert values_crc32(list(indices)[:-1] + [indices[-1] + 1]) != crc32
