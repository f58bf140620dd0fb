"""num_workers=0: the same batches as torch.utils.data, len() as torch computes it,
reproducible shuffles, and conveyor's per-batch seeding that leaves the training
loop's generators alone."""

import random
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct

Pair = namedtuple("Pair", "x y")


class Records:
    """Samples with every structure default_collate handles."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "x": np.full((2, 3), i, dtype=np.float32),
            "label": i % 4,
            "weight": i / 2,
            "name": f"s{i}",
            "pair": Pair(i, [i, -i]),
        }


class Stream(tud.IterableDataset):
    def __init__(self, n=11, length=None):
        self.n, self.length = n, length

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        if self.length is None:
            raise TypeError("no len")
        return self.length


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
        dict(batch_size=4, drop_last=True),
        dict(batch_size=1),
        dict(batch_size=None),
        dict(batch_size=5, shuffle=True),
        dict(batch_sampler=[[3, 1], [0], [22, 21, 20]]),
        dict(sampler=[5, 4, 3], batch_size=2),
    ],
    ids=str,
)
def test_map_dataset_batches_equal_torch(kwargs):
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    extra = "shuffle" in kwargs
    theirs = list(tud.DataLoader(Records(), generator=g1 if extra else None, **kwargs))
    ours = list(ct.DataLoader(Records(), generator=g2 if extra else None, **kwargs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert_same(a, b)


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)], ids=str
)
def test_iterable_dataset_batches_and_len_equal_torch(kwargs):
    theirs_loader, ours_loader = tud.DataLoader(Stream(length=11), **kwargs), ct.DataLoader(Stream(length=11), **kwargs)
    assert len(ours_loader) == len(theirs_loader)
    for a, b in zip(list(ours_loader), list(theirs_loader), strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("n, bs, drop", [(10, 3, False), (10, 3, True), (9, 3, False), (1, 5, False), (0, 2, False)])
def test_len_equals_torch(n, bs, drop):
    data = list(range(n))
    assert len(ct.DataLoader(data, batch_size=bs, drop_last=drop)) == len(
        tud.DataLoader(data, batch_size=bs, drop_last=drop)
    )
    assert len(conveyor.DataLoader(data, batch_size=bs, drop_last=drop)) == len(
        list(conveyor.DataLoader(data, batch_size=bs, drop_last=drop))
    )


def test_iterable_longer_than_len_warns_like_torch():
    loader = ct.DataLoader(Stream(n=6, length=3), batch_size=None)
    assert len(loader) == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(loader)
    assert any(
        "was reported to be 3(when accessing len(dataloader)), but 4 samples have been fetched" in str(w.message)
        for w in caught
    )


def test_shuffle_order_matches_torch_under_global_seed():
    torch.manual_seed(123)
    theirs = [b.tolist() for b in tud.DataLoader(list(range(20)), batch_size=6, shuffle=True)]
    torch.manual_seed(123)
    ours = [b.tolist() for b in ct.DataLoader(list(range(20)), batch_size=6, shuffle=True)]
    assert ours == theirs


def test_core_returns_numpy_and_torch_facade_returns_tensors():
    core = next(iter(conveyor.DataLoader(Records(), batch_size=3)))
    assert isinstance(core["x"], np.ndarray) and core["x"].shape == (3, 2, 3)
    assert core["label"].dtype == np.int64 and core["weight"].dtype == np.float64
    façade = next(iter(ct.DataLoader(Records(), batch_size=3)))
    assert isinstance(façade["x"], torch.Tensor) and façade["label"].dtype == torch.int64


def test_seed_makes_shuffles_reproducible_and_epochs_differ():
    def run():
        loader = conveyor.DataLoader(list(range(30)), batch_size=30, shuffle=True, seed=5)
        return [next(iter(loader)).tolist() for _ in range(3)]

    first, second = run(), run()
    assert first == second
    assert first[0] != first[1] and sorted(first[0]) == list(range(30))


def test_set_epoch_replays_an_epoch():
    loader = conveyor.DataLoader(list(range(30)), batch_size=30, shuffle=True, seed=5)
    epochs = [next(iter(loader)).tolist() for _ in range(3)]
    loader.set_epoch(1)
    assert next(iter(loader)).tolist() == epochs[1]


def test_numpy_generator_gives_reproducible_order():
    a = [
        b.tolist()
        for b in conveyor.DataLoader(list(range(12)), batch_size=4, shuffle=True, generator=np.random.default_rng(3))
    ]
    b = [
        b.tolist()
        for b in conveyor.DataLoader(list(range(12)), batch_size=4, shuffle=True, generator=np.random.default_rng(3))
    ]
    assert a == b and sorted(sum(a, [])) == list(range(12))


class Noisy:
    """Random augmentation with the three global generators."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.array([i, random.random(), np.random.rand(), torch.rand(()).item()])


def test_batches_are_seeded_and_training_loop_generators_untouched():
    loader = conveyor.DataLoader(Noisy(), batch_size=4, seed=1)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    before = (random.random(), np.random.rand(), torch.rand(()).item())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    first = [b.copy() for b in loader]
    after = (random.random(), np.random.rand(), torch.rand(()).item())
    assert before == after  # loading did not move the caller's generators
    second = [b.copy() for b in loader]
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))  # next epoch: new draws
    loader.set_epoch(0)
    replay = list(loader)
    assert all(np.array_equal(a, b) for a, b in zip(first, replay))


def test_getitems_is_used_for_batches():
    class Batched(Records):
        calls = []

        def __getitems__(self, indices):
            self.calls.append(list(indices))
            return [self[i] for i in indices]

    ds = Batched(6)
    list(conveyor.DataLoader(ds, batch_size=4))
    assert ds.calls == [[0, 1, 2, 3], [4, 5]]


def test_torch_datasets_work_unchanged():
    ds = tud.TensorDataset(torch.arange(10.0), torch.arange(10))
    for a, b in zip(ct.DataLoader(ds, batch_size=3), tud.DataLoader(ds, batch_size=3), strict=True):
        assert_same(a, b)


def test_pin_memory_without_accelerator_warns_once_and_still_loads():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(ct.DataLoader(list(range(4)), batch_size=2, pin_memory=True))
    assert len(batches) == 2
    assert sum("no accelerator is found" in str(w.message) for w in caught) == 1
