"""A shuffled loader with a computed order (order="auto" above the threshold,
lowered here so that the datasets stay small): the same batches for any
number and kind of workers, an exact resume mid-epoch through the loader's
state, a state of a few hundred bytes whatever the dataset's size, and a
state of the stored order refused rather than read as another order."""

from __future__ import annotations

import json

import numpy as np
import pytest

import conveyor.sampler.order as order_module
from conveyor import DataLoader

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]

WORKERS = {
    "in this process": {},
    "1 process": {"num_workers": 1},
    "2 processes": {"num_workers": 2},
    "4 processes": {"num_workers": 4},
    "2 threads": {"num_workers": 2, "worker_method": "thread"},
}


class Length:
    """``n`` items, item ``i`` the array ``[i]``, nothing of ``n`` held."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i])


@pytest.fixture
def small_threshold(monkeypatch):
    """order="auto" computes the order of datasets of more than 20 items."""
    monkeypatch.setattr(order_module, "COMPUTED_ABOVE", 20)


def batches_of(loader, count=None):
    out = []
    for batch in loader:
        out.append(np.asarray(batch).ravel().tolist())
        if count is not None and len(out) == count:
            break
    return out


def test_a_shuffled_loader_above_the_threshold_computes_its_order(small_threshold):
    loader = DataLoader(Length(50), batch_size=4, shuffle=True, seed=3)
    assert loader.sampler.order == "computed"
    assert sorted(i for batch in batches_of(loader) for i in batch) == list(range(50))
    assert DataLoader(Length(20), batch_size=4, shuffle=True, seed=3).sampler.order == "stored"


def test_the_batches_are_the_same_for_every_number_and_kind_of_workers(small_threshold):
    runs = {}
    for name, workers in WORKERS.items():
        loader = DataLoader(Length(60), batch_size=4, shuffle=True, seed=3, **workers)
        runs[name] = [batches_of(loader), batches_of(loader)]  # two epochs
    first = runs["in this process"]
    assert all(run == first for run in runs.values())
    assert first[0] != first[1] and sorted(sum(first[1], [])) == list(range(60))


@pytest.mark.parametrize("workers", list(WORKERS), ids=list(WORKERS))
@pytest.mark.parametrize("randomness", ["seed", "generator"])
def test_a_resume_mid_epoch_gives_exactly_the_remaining_batches(small_threshold, workers, randomness):
    def build():
        source = {"seed": 5} if randomness == "seed" else {"generator": np.random.default_rng(5)}
        return DataLoader(Length(61), batch_size=4, shuffle=True, **source, **WORKERS[workers])

    reference = build()
    expected = [batches_of(reference), batches_of(reference)]
    loader = build()
    it = iter(loader)
    head = [np.asarray(next(it)).ravel().tolist() for _ in range(11)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = build()
    resumed.load_state_dict(state)
    assert head + batches_of(resumed) == expected[0]
    assert batches_of(resumed) == expected[1]  # the next epoch as if never interrupted


def test_the_state_is_as_small_for_ten_billion_samples_as_for_a_hundred():
    sizes = {}
    for n in (100, 10**10):
        loader = DataLoader(Length(n), batch_size=4, sampler=None, shuffle=True, seed=1)
        next(iter(loader))
        sizes[n] = len(json.dumps(loader.state_dict()))
    assert loader.sampler.order == "computed"
    assert sizes[10**10] - sizes[100] < 64  # a few more digits, and the order recorded


def test_a_state_of_the_stored_order_does_not_load_into_a_computed_one(monkeypatch):
    stored = DataLoader(Length(50), batch_size=4, shuffle=True, seed=3)
    it = iter(stored)
    next(it)
    state = stored.state_dict()
    del it
    monkeypatch.setattr(order_module, "COMPUTED_ABOVE", 20)
    computed = DataLoader(Length(50), batch_size=4, shuffle=True, seed=3)
    with pytest.raises(ValueError, match="the stored order and this sampler has the computed one"):
        computed.load_state_dict(state)
    back = batches_of(computed)  # refused: the loader starts its epoch afresh, in its own order
    assert sorted(sum(back, [])) == list(range(50))
