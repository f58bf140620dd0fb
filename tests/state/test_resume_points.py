"""A state saved at any point of an epoch resumes exactly.

Swept: every point of an epoch (right after ``iter()``, between any two
batches, after the last batch, after the end), for a map-style dataset, an
iterable dataset with state, one without (resumed by reading again), and an
iterable that is its own iterator (torchdata's pattern: ``__iter__`` returns
``self`` without starting over, and the same object serves the resumed
loader); with no workers, worker threads and worker processes. The batches
after the resume are those the interrupted pass went on to give, and a state
saved by the resumed loader before its first batch resumes exactly again.
"""

from __future__ import annotations

import numpy as np
import pytest

import conveyor
from resume_helpers import CountingIterator

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore:.*has no state_dict/load_state_dict.*:UserWarning"),
]

ITEMS = 10
BATCH = 3


class Counting(conveyor.IterableDataset):
    """An iterable whose iterator has state: items 0..ITEMS-1, shared out among workers."""

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return CountingIterator(list(range(worker, ITEMS, workers)))


class Stateless(conveyor.IterableDataset):
    """An iterable without state: resumed by reading its items again."""

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(worker, ITEMS, workers))


class OwnIterator(conveyor.IterableDataset):
    """Its own iterator, which ``iter()`` does not start over; draws from
    each sample's generator (conveyor.sample_rng())."""

    def __init__(self):
        self.at = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at >= ITEMS:
            raise StopIteration
        self.at += 1
        return (self.at - 1) * 1000 + int(conveyor.sample_rng().numpy_generator.integers(1000))

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


DATASETS = {
    "map": lambda: list(range(ITEMS)),
    "iterable": Counting,
    "stateless iterable": Stateless,
    "own iterator": OwnIterator,
}
WORKERS = {
    "in process": {"num_workers": 0},
    "threads": {"num_workers": 2, "worker_method": "thread"},
    "processes": {"num_workers": 2},
}


def make(dataset, workers):
    shuffle = {"shuffle": True, "seed": 7} if isinstance(dataset, list) else {"seed": 7}
    return conveyor.DataLoader(dataset, batch_size=BATCH, **shuffle, **WORKERS[workers])


def plain(batches):
    return [np.asarray(b).tolist() for b in batches]


@pytest.mark.parametrize("workers", list(WORKERS))
@pytest.mark.parametrize("kind", list(DATASETS))
def test_a_state_saved_at_any_point_resumes_exactly(kind, workers):
    length = len(plain(make(DATASETS[kind](), workers)))  # (unsharded iterables: every worker gives all)
    for point in range(length + 2):  # (length + 1: after the end of the epoch)
        # The same dataset object serves every loader: a dataset that is its
        # own iterator carries where it stands from one to the next.
        dataset = DATASETS[kind]()
        loader = make(dataset, workers)
        batches = iter(loader)
        before = plain(next(batches) for _ in range(min(point, length)))
        if point > length:
            assert next(batches, None) is None
        state = loader.state_dict()
        expected = plain(batches) if point <= length else plain(loader)  # (after the end: the next epoch)
        del batches

        resumed = make(dataset, workers)
        resumed.load_state_dict(state)
        chained = resumed.state_dict()  # (saved again before any batch: the same point)
        got = plain(resumed)
        where = f"{kind}, {workers}, state saved after {point} of {length} batches"
        assert got == expected, f"{where}: resumed {got}, expected {expected} (before it: {before})"

        again = make(dataset, workers)
        again.load_state_dict(chained)
        assert plain(again) == expected, f"{where}, saved again right after loading it"


@pytest.mark.parametrize("workers", ["in process", "threads"])
def test_a_state_saved_before_the_first_batch_of_a_resumed_pass_resumes_it(workers):
    """Resumed mid-epoch, then saved right after iter(): the copies stand
    where the first state left them, not at a fresh start."""
    dataset = Counting()
    loader = make(dataset, workers)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    expected = plain(batches)
    resumed = make(dataset, workers)
    resumed.load_state_dict(state)
    started = iter(resumed)
    saved_at_start = resumed.state_dict()
    assert plain(started) == expected
    again = make(dataset, workers)
    again.load_state_dict(saved_at_start)
    assert plain(again) == expected
