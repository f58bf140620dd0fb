"""DataLoader(skip_bad_samples=...): a budget for samples whose loading
raises. Each is left out of its batch, logged and counted in the stats; the
batches are the same for any number and kind of workers; past the budget,
iteration fails listing every skip; a resumed epoch carries its skips on."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
from conveyor import BadSampleBudgetExceeded, DataLoader, SkipBudget

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]

KINDS = [
    dict(num_workers=0),
    dict(num_workers=2),
    dict(num_workers=3, worker_method="thread"),
    dict(num_workers=2, reads_in_flight=3),
    dict(num_workers=2, multiprocessing_context="spawn"),
]
KIND_IDS = ["in-process", "2-processes", "3-threads", "reads-in-flight", "spawn"]


class Corrupt:
    """Sample ``i`` is ``[i, a draw]``; the samples in ``bad`` raise OSError
    (a truncated file), those in ``missing`` KeyError."""

    def __init__(self, n=40, bad=(3, 17, 18, 19, 30), missing=()):
        self.n, self.bad, self.missing = n, set(bad), set(missing)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise OSError(f"truncated file for sample {i}")
        if i in self.missing:
            raise KeyError(i)
        return np.array([i, conveyor.sample_rng().numpy_generator.random()])


def rows(loader):
    return [np.asarray(batch).tolist() for batch in loader]


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_bad_samples_are_left_out_the_same_way_for_every_kind_of_workers(kind, caplog):
    expected = rows(DataLoader(Corrupt(bad=()), batch_size=4, shuffle=True, seed=2))
    expected = [[row for row in batch if row[0] not in Corrupt().bad] for batch in expected]
    expected = [batch for batch in expected if batch]
    loader = DataLoader(Corrupt(), batch_size=4, shuffle=True, seed=2, skip_bad_samples=5, **kind)
    with caplog.at_level(logging.WARNING, logger="conveyor"):
        got = rows(loader)
    assert got == expected
    skipped = loader.stats().skipped
    assert sorted(record.index for record in skipped) == sorted(Corrupt().bad)
    assert all(record.error.startswith("OSError: truncated file for sample") for record in skipped)
    assert all("in __getitem__" in record.traceback for record in skipped)
    logged = [r.getMessage() for r in caplog.records if r.name == "conveyor"]
    for index in Corrupt().bad:
        assert any(f"skipped sample {index} of batch" in line for line in logged), logged
    json.dumps(loader.stats().to_dict())  # (plain values)


def test_a_batch_whose_every_sample_fails_is_left_out():
    loader = DataLoader(Corrupt(n=12, bad=(4, 5, 6, 7)), batch_size=4, num_workers=2, skip_bad_samples=4)
    assert [[row[0] for row in batch] for batch in rows(loader)] == [[0, 1, 2, 3], [8, 9, 10, 11]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_past_the_budget_iteration_fails_listing_every_skip(num_workers):
    loader = DataLoader(Corrupt(), batch_size=4, num_workers=num_workers, skip_bad_samples=3)
    seen = []
    with pytest.raises(BadSampleBudgetExceeded) as caught:
        for batch in loader:
            seen.append(batch)
    error = caught.value
    assert [record.index for record in error.skipped] == [3, 17, 18, 19]  # batch 4 held the fourth
    text = str(error)
    assert "4 samples of 40 failed this epoch" in text and "at most 3" in text
    for index in (3, 17, 18, 19):
        assert f"  {index} (batch " in text
    assert "truncated file for sample 3" in text and "Traceback" in text
    assert len(seen) == 4  # batches 0-3 came through; the iterator is closed
    # The next epoch starts afresh.
    with pytest.raises(BadSampleBudgetExceeded):
        rows(loader)


def test_a_fraction_of_the_epoch():
    assert len(rows(DataLoader(Corrupt(), batch_size=4, skip_bad_samples=0.125))) == 10  # 5 of 40 allowed
    with pytest.raises(BadSampleBudgetExceeded, match=r"at most 4\)"):
        rows(DataLoader(Corrupt(), batch_size=4, skip_bad_samples=0.1))


def test_only_the_budget_s_exception_types_are_skipped():
    loader = DataLoader(
        Corrupt(bad=(3,), missing=(9,)),
        batch_size=4,
        num_workers=2,
        skip_bad_samples=SkipBudget(count=5, errors=(OSError,)),
    )
    it = iter(loader)
    assert [row[0] for row in np.asarray(next(it))] == [0, 1, 2]
    assert [row[0] for row in np.asarray(next(it))] == [4, 5, 6, 7]
    with pytest.raises(KeyError) as caught:
        next(it)
    assert caught.value.batch_index == 2  # an ordinary batch error, with its context
    assert [row[0] for row in np.asarray(next(it))] == [12, 13, 14, 15]  # and iteration goes on, as in torch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_epoch_carries_its_skips_on(num_workers):
    def loader():
        return DataLoader(
            Corrupt(bad=(2, 6, 25, 33)), batch_size=4, num_workers=num_workers, skip_bad_samples=3, shuffle=False
        )

    first = loader()
    it = iter(first)
    for _ in range(3):
        next(it)  # batches 0-2: samples 2 and 6 skipped
    state = first.state_dict()
    del it
    assert len(state["skipped"]) == 2
    resumed = loader()
    resumed.load_state_dict(json.loads(json.dumps(state)))  # (a state survives JSON)
    with pytest.raises(BadSampleBudgetExceeded) as caught:
        rows(resumed)
    assert [record.index for record in caught.value.skipped] == [2, 6, 25, 33]
    # As the uninterrupted epoch does: over budget at the same batch, with the same list.
    with pytest.raises(BadSampleBudgetExceeded) as uninterrupted:
        rows(loader())
    same = lambda records: [(r.index, r.batch_index, r.error) for r in records]  # noqa: E731  (pids differ)
    assert same(caught.value.skipped) == same(uninterrupted.value.skipped)


def test_the_torch_facade_gives_tensors():
    batches = list(ct.DataLoader(Corrupt(n=8, bad=(1,)), batch_size=4, num_workers=2, skip_bad_samples=1))
    assert all(isinstance(b, torch.Tensor) for b in batches)
    assert [b[:, 0].tolist() for b in batches] == [[0.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("5", TypeError, "skip_bad_samples must be None, an int"),
        (-1, ValueError, "count must be a non-negative int"),
        (1.5, ValueError, "fraction must be a number in (0, 1]"),
        (SkipBudget, TypeError, "skip_bad_samples must be None"),
    ],
)
def test_bad_budgets_are_refused_at_construction(value, error, message):
    with pytest.raises(error, match=__import__("re").escape(message)):
        DataLoader(Corrupt(), skip_bad_samples=value)


def test_a_budget_needs_a_map_style_dataset():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="skip_bad_samples needs a map-style dataset"):
        DataLoader(Stream(), skip_bad_samples=3)
    with pytest.raises(TypeError, match="exception classes"):
        SkipBudget(count=1, errors=(ValueError, "OSError"))
    with pytest.raises(ValueError, match="needs count= .* or fraction="):
        SkipBudget()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_with_batching_off_a_bad_sample_is_left_out(num_workers):
    loader = DataLoader(Corrupt(n=8, bad=(2, 5)), batch_size=None, num_workers=num_workers, skip_bad_samples=2)
    assert [int(row[0]) for row in (np.asarray(s) for s in loader)] == [0, 1, 3, 4, 6, 7]
    assert [record.index for record in loader.stats().skipped] == [2, 5]
    with pytest.raises(BadSampleBudgetExceeded):
        list(DataLoader(Corrupt(n=8, bad=(2, 5)), batch_size=None, num_workers=num_workers, skip_bad_samples=1))
