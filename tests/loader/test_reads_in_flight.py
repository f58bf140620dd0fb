"""DataLoader(reads_in_flight=N): a batch's samples read N at a time, in
threads of the loading process, for a __getitem__ that waits (on storage, a
network). Batches are the same as reading one after another."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import conveyor
import conveyor.torch as ct

pytestmark = pytest.mark.timeout(60)


class CountsReads:
    """Sample ``i`` is ``(i, reads in flight in this process when it began)``;
    each read waits a little, as a remote read would."""

    def __init__(self, n: int, fail_at: int = -1):
        self.n, self.fail_at = n, fail_at
        self._lock = threading.Lock()
        self._in_flight = 0

    def __getstate__(self):  # (the lock does not travel; each process counts its own reads)
        return {"n": self.n, "fail_at": self.fail_at}

    def __setstate__(self, state):
        self.__init__(state["n"], state["fail_at"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        with self._lock:
            self._in_flight += 1
            in_flight = self._in_flight
        try:
            time.sleep(0.01)
            if i == self.fail_at:
                raise KeyError(f"sample {i} is missing")
            return np.array([i, in_flight])
        finally:
            with self._lock:
                self._in_flight -= 1


def _batches(loader):
    return [np.asarray(batch) for batch in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_reads_overlap_and_batches_are_the_same(num_workers):
    one = _batches(conveyor.DataLoader(CountsReads(40), batch_size=8, num_workers=num_workers))
    four = _batches(conveyor.DataLoader(CountsReads(40), batch_size=8, num_workers=num_workers, reads_in_flight=4))
    assert [b[:, 0].tolist() for b in four] == [b[:, 0].tolist() for b in one]  # same samples, same order
    assert max(int(b[:, 1].max()) for b in one) == 1
    in_flight = max(int(b[:, 1].max()) for b in four)
    assert 1 < in_flight <= 4


@pytest.mark.parametrize("num_workers, method", [(0, None), (2, "fork"), (2, "spawn")])
def test_a_failing_read_is_that_batchs_error_and_iteration_goes_on(num_workers, method):
    loader = conveyor.DataLoader(
        CountsReads(24, fail_at=10),
        batch_size=8,
        num_workers=num_workers,
        reads_in_flight=4,
        multiprocessing_context=method,
    )
    it = iter(loader)
    assert next(it)[:, 0].tolist() == list(range(8))
    with pytest.raises(KeyError, match="sample 10 is missing"):
        next(it)
    assert next(it)[:, 0].tolist() == list(range(16, 24))


def test_a_pass_left_early_stops_the_reading_threads():
    loader = conveyor.DataLoader(CountsReads(40), batch_size=8, reads_in_flight=4)
    for _ in loader:
        break
    del _
    # (the suite's leak check fails the test if a reading thread is left)


def test_torch_facade_and_getitems_datasets():
    assert [b.tolist() for b in ct.DataLoader(list(range(6)), batch_size=3, reads_in_flight=3)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]

    class Batched:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            raise AssertionError("__getitems__ reads the batch")

        def __getitems__(self, indices):
            return [i * 10 for i in indices]

    loader = conveyor.DataLoader(Batched(), batch_size=3, reads_in_flight=4)
    assert [b.tolist() for b in loader] == [[0, 10, 20], [30, 40, 50]]


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "4"])
def test_bad_reads_in_flight(value):
    with pytest.raises(ValueError, match="reads_in_flight"):
        conveyor.DataLoader(list(range(4)), reads_in_flight=value)
