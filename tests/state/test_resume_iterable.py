"""Resume of iterable datasets (issue 5): a dataset or iterator with
state_dict resumes exactly, in process and inside each worker (copies put
back, exhausted ones retired, the round robin where it stood), a dataset
that is its own iterator, persistent workers' copies between epochs,
in_order=False; one without state is fast-forwarded with a warning, and
needs the same worker count.

Under fork (the default here) workers inherit this module, so module-level
datasets are fine.
"""

import warnings

import numpy as np
import pytest

import conveyor
from conveyor import DataLoader
from resume_helpers import json_round_trip, plain

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


# --------------------------------------------------------- iterable datasets
class Position:
    """An iterator over ``range(n)`` with random noise, resumable by position."""

    def __init__(self, n):
        self.n, self.i, self.produced = n, 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        self.produced += 1
        return np.array([self.i - 1, np.random.rand()])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class StatefulIteratorStream(conveyor.IterableDataset):
    def __init__(self, n=23):
        self.n = n
        self.iterators = []

    def __iter__(self):
        self.iterators.append(Position(self.n))
        return self.iterators[-1]


class StatefulStream(conveyor.IterableDataset):
    """The dataset itself keeps the position (its __iter__ is a generator)."""

    def __init__(self, n=23):
        self.n, self.start = n, 0

    def __iter__(self):
        for i in range(self.start, self.n):
            self.start = i + 1
            yield np.array([i, np.random.rand()])
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


class PlainStream(conveyor.IterableDataset):
    def __init__(self, n=23):
        self.n = n

    def __iter__(self):
        info = conveyor.get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, self.n, step):
            yield np.array([i, np.random.rand()])


@pytest.mark.parametrize("Stream", [StatefulIteratorStream, StatefulStream])
def test_iterable_dataset_with_state_resumes_exactly_in_process(Stream):
    expected = [plain(b) for b in DataLoader(Stream(), batch_size=4, seed=0)]
    loader = DataLoader(Stream(), batch_size=4, seed=0)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = json_round_trip(loader.state_dict())
    del it
    dataset = Stream()
    resumed = DataLoader(dataset, batch_size=4, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fast-forward warning: nothing is re-read
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected
    if isinstance(dataset, StatefulIteratorStream):
        assert dataset.iterators[0].produced == 23 - 12  # the resumed iterator produced only the rest


def test_iterable_dataset_without_state_is_fast_forwarded_with_a_warning():
    expected = [plain(b) for b in DataLoader(PlainStream(), batch_size=4, seed=0)]
    loader = DataLoader(PlainStream(), batch_size=4, seed=0)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(2)]
    resumed = DataLoader(PlainStream(), batch_size=4, seed=0)
    with pytest.warns(UserWarning, match="reads again, without collating or sending them, the items of the 2 batches"):
        resumed.load_state_dict(loader.state_dict())
    assert head + [plain(b) for b in resumed] == expected


@pytest.mark.timeout(60)
def test_iterable_dataset_without_state_with_workers_needs_the_same_worker_count():
    expected = [plain(b) for b in DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)]
    loader = DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers=2"):
        DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=1).load_state_dict(state)
    resumed = DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)
    with pytest.warns(UserWarning, match="reads again"):
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected


class ShardPosition:
    """Worker w's iterator over its shard: w*1000, w*1000+1, ...; the state is the position."""

    def __init__(self, worker, size):
        self.worker, self.size, self.i = worker, size, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return np.array([self.worker * 1000 + self.i - 1, np.random.rand()])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class ShardedStatefulStream(conveyor.IterableDataset):
    """Shards of uneven sizes (workers run out at different times)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker = info.id if info else 0
        return ShardPosition(worker, self.sizes[worker])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_after", [1, 4, 7, 9])
def test_iterable_dataset_state_inside_workers_resumes_exactly(stop_after):
    """Each worker's iterator state travels with its batches; a resumed loader
    puts every copy back, retires the workers that had run out, and continues
    the round robin where it stood, without re-reading anything."""
    sizes = [9, 3, 14]
    settings = dict(batch_size=2, seed=0, num_workers=3)
    expected = [plain(b) for b in DataLoader(ShardedStatefulStream(sizes), **settings)]
    loader = DataLoader(ShardedStatefulStream(sizes), **settings)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(stop_after)]
    state = json_round_trip(loader.state_dict())
    del it
    resumed = DataLoader(ShardedStatefulStream(sizes), **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no re-reading, no warning
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected
    uninterrupted = DataLoader(ShardedStatefulStream(sizes), **settings)
    list(uninterrupted)
    assert [plain(b) for b in resumed] == [plain(b) for b in uninterrupted], "the next epoch follows on"


@pytest.mark.timeout(60)
def test_iterable_dataset_state_inside_workers_needs_the_same_worker_count():
    loader = DataLoader(ShardedStatefulStream([5, 5]), batch_size=2, seed=0, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ShardedStatefulStream([5, 5]), batch_size=2, seed=0, num_workers=1).load_state_dict(state)


class OwnIterator(conveyor.IterableDataset):
    """An iterable dataset that is its own iterator: ``__iter__`` sets up its
    position (its worker's share) and returns ``self``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        share = self.n // workers
        self.at, self.end = share * worker, share * (worker + 1)
        return self

    def __next__(self):
        if self.at >= self.end:
            raise StopIteration
        self.at += 1
        return self.at - 1

    def state_dict(self):
        return {"at": self.at, "end": self.end}

    def load_state_dict(self, state):
        self.at, self.end = state["at"], state["end"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_that_is_its_own_iterator_resumes_where_it_stood(num_workers):
    """Its state is restored after iter() (which sets its position up), as torchdata does."""
    loader = DataLoader(OwnIterator(40), batch_size=None, num_workers=num_workers)
    it = iter(loader)
    seen = [int(next(it)) for _ in range(30)]
    state = json_round_trip(loader.state_dict())
    del it, loader
    resumed = DataLoader(OwnIterator(40), batch_size=None, num_workers=num_workers)
    resumed.load_state_dict(state)
    seen += [int(x) for x in resumed]
    assert sorted(seen) == list(range(40))


class CountsItsEpochs(conveyor.IterableDataset):
    """Each worker's copy counts the epochs it has served (persistent workers
    keep it) and tags its items with that count; the copies run out at
    different times."""

    def __init__(self):
        self.epoch = 0

    def __iter__(self):
        info = conveyor.get_worker_info()
        sizes = [2, 6]
        start = sum(sizes[: info.id])
        for i in range(start, start + sizes[info.id]):
            yield i, self.epoch
        self.epoch += 1

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


@pytest.mark.timeout(60)
def test_persistent_workers_copies_carry_their_state_across_a_resume_between_epochs():
    def make():
        return DataLoader(CountsItsEpochs(), batch_size=None, num_workers=2, persistent_workers=True)

    def tagged(loader):
        return sorted((int(i), int(e)) for i, e in loader)

    loader = make()
    tagged(loader)
    state = json_round_trip(loader.state_dict())  # the end of epoch 0
    expected = tagged(loader)
    assert {e for _, e in expected} == {1}
    resumed = make()
    resumed.load_state_dict(state)
    assert tagged(resumed) == expected
    assert {e for _, e in tagged(resumed)} == {2}, "and the epoch after"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("Stream", [PlainStream, lambda: ShardedStatefulStream([14, 9])])
def test_iterable_dataset_resumes_with_in_order_false_too(Stream):
    """Each worker's copy is saved as of its own delivered batches, so the
    order batches arrived in does not matter: every item once across the
    interruption."""

    def items(batches):
        return [int(x) for b in batches for x in np.asarray(b).reshape(len(b), -1)[:, 0]]

    loader = DataLoader(Stream(), batch_size=3, seed=0, num_workers=2, in_order=False)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PlainStream: items are read again; said elsewhere)
        state = json_round_trip(loader.state_dict())
        del it
        resumed = DataLoader(Stream(), batch_size=3, seed=0, num_workers=2, in_order=False)
        resumed.load_state_dict(state)
        rest = list(resumed)
    expected = sorted(items(DataLoader(Stream(), batch_size=3, seed=0, num_workers=2)))
    assert sorted(items(head) + items(rest)) == expected


def test_a_state_of_one_rank_of_two_is_refused_by_a_loader_on_one_process():
    saved = conveyor.DataLoader(conveyor.ShardedIterable(list(range(20)), num_replicas=2, rank=1), batch_size=2)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    del it
    alone = conveyor.DataLoader(conveyor.ShardedIterable(list(range(20))), batch_size=2)
    with pytest.raises(ValueError, match="ranks"):
        alone.load_state_dict(state)
