"""Leaves that fill themselves (``shape``, ``dtype``, ``fill_into(out)``, as
conveyor.images' PendingImage) are made straight in their row of the batch
by the worker's row placement: no array of their own, no copy; with more
than one fill thread (an epoch's first batch) the fills are shared out and
done before collate reads a row."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import procutil
from conveyor._engine.loading.rows import RowPlacer
from conveyor.collate import collate_into


class Writer:
    """The slot writer's allocate: one arena the test can inspect."""

    def __init__(self):
        self.arrays = []

    def allocate(self, shape, dtype):
        array = np.empty(shape, dtype)
        self.arrays.append(array)
        return array


class Filled:
    """A leaf that writes ``value`` into the row it is given, noting where and in which thread."""

    shape, dtype = (4, 3), np.dtype(np.uint8)

    def __init__(self, value, fail=False):
        self.value, self.fail, self.out, self.thread = value, fail, None, None

    def fill_into(self, out):
        if self.fail:
            raise ValueError(f"cannot decode sample {self.value}")
        self.out, self.thread = out, threading.current_thread().name
        out[...] = self.value


def test_a_leaf_fills_its_row_of_the_batch_and_collate_takes_the_buffer_as_it_is():
    writer = Writer()
    placer = RowPlacer(writer, 3)
    leaves = [Filled(k) for k in range(3)]
    samples = [placer.place({"image": leaf, "label": k}, k) for k, leaf in enumerate(leaves)]
    (buffer, *_) = writer.arrays
    assert buffer.shape == (3, 4, 3)
    assert all(leaf.out.base is buffer or leaf.out.base is buffer.base for leaf in leaves)  # a view of the batch
    batch = collate_into(samples, placer)
    assert batch["image"] is buffer  # claimed: no second copy
    assert [int(v) for v in batch["image"][:, 0, 0]] == [0, 1, 2] and list(batch["label"]) == [0, 1, 2]


def test_a_leaf_that_does_not_fit_is_left_for_collate():
    placer = RowPlacer(Writer(), 2)
    first = placer.place(np.zeros((2, 2), np.uint8), 0)
    leaf = Filled(5)
    assert placer.place(leaf, 1) is leaf and leaf.out is None  # another shape: not placed
    assert first.shape == (2, 2)


@pytest.mark.parametrize("threads", [2, 3])
def test_with_fill_threads_the_rows_are_filled_before_collate_reads_them(threads):
    placer = RowPlacer(Writer(), 7, fill_threads=threads)
    leaves = [Filled(10 + k) for k in range(7)]
    samples = [placer.place(leaf, k) for k, leaf in enumerate(leaves)]
    assert all(leaf.out is None for leaf in leaves)  # put off until collate asks
    batch = collate_into(samples, placer)
    assert [int(v) for v in batch[:, 0, 0]] == list(range(10, 17))
    assert len({leaf.thread for leaf in leaves}) == threads  # shared out over the threads


def test_a_failing_fill_raises_from_collate():
    placer = RowPlacer(Writer(), 4, fill_threads=2)
    samples = [placer.place(Filled(k, fail=k == 3), k) for k in range(4)]
    with pytest.raises(ValueError, match="cannot decode sample 3"):
        collate_into(samples, placer)


class WhereFilled:
    """A leaf whose row says which thread filled it: 0 the worker's own,
    1 a fill thread of a first batch, 2 the lower-priority background thread.

    The first batch's leaves (samples 0-7) finish filling only once a leaf of
    the second batch (samples 8-15) has been filled (``marker``, a file), so
    the first batch is still filling while the second's worker holds: its
    turn then comes from the background thread, however the two worker
    processes happened to start (bounded: after ``WAIT_S`` the first batch
    fills anyway, and the test's assertion says what came instead)."""

    shape, dtype = (2,), np.dtype(np.int64)
    WAIT_S = 60.0

    def __init__(self, index, marker):
        self.index, self.marker = index, marker

    def fill_into(self, out):
        if self.index < 8:
            procutil.wait_for(lambda: os.path.exists(self.marker), self.WAIT_S, what="the second batch's fill")
        name = threading.current_thread().name
        out[...] = 2 if name == "conveyor-fill-bg" else 1 if name.startswith("conveyor-fill") else 0
        if 8 <= self.index < 16:
            open(self.marker, "a").close()


class Leaves:
    def __init__(self, marker):
        self.marker = marker

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return WhereFilled(i, self.marker)


@pytest.mark.timeout(120)
def test_an_epochs_first_batch_is_filled_by_a_thread_per_core_and_the_other_workers_wait_their_turn(
    monkeypatch, tmp_path
):
    import conveyor
    from conveyor._engine.executor import dispatch

    monkeypatch.setattr(dispatch, "FIRST_BATCH_FILL_THREADS", 2)
    marker = str(tmp_path / "second-batch-filled")
    loader = conveyor.DataLoader(Leaves(marker), batch_size=8, num_workers=2, prefetch_factor=2)
    for _ in range(2):  # (each epoch)
        if os.path.exists(marker):
            os.remove(marker)
        batches = [set(batch[:, 0].tolist()) for batch in loader]
        assert batches[0] == {0, 1}  # the first batch: shared out over two threads
        assert batches[1] == {2}  # the other worker's first batch, meanwhile: in the background
        assert all(b == {0} for b in batches[2:])  # every other batch as before
