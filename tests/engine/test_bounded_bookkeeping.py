"""The main process's bookkeeping stays flat over endless streams.

A loader may run for days over an endless iterable: nothing it keeps per
batch may grow with the number of batches. Each structure a batch passes
through in the main process is driven here over a million batches (the
reorder buffer in both orders, with retired batches; the workers' progress
through an iterable; the epoch's progress; the stats recorder), and a real
loader over an endless stream is measured between two points of its run.
A structure's memory is the size of every object it reaches
(:func:`deep_size`), measured at two points of the run, so the measure is
exact and independent of the machine's speed; the loader is measured with
``tracemalloc`` (everything its main process allocates) between two points.
"""

from __future__ import annotations

import gc
import itertools
import sys
import tracemalloc
import types

import pytest

import conveyor
from conveyor._engine.executor.progress import IterableProgress
from conveyor._engine.executor.records import Delivered, Timings
from conveyor._engine.executor.reorder import ReorderBuffer
from conveyor._engine.loading.copies import CopyState
from conveyor.state import EpochProgress
from conveyor.stats import StatsRecorder
from conveyor.stats.recorder import WINDOW

#: Batches each structure is driven through.
MILLION = 1_000_000
#: Growth allowed between the two measuring points, in bytes: far below one
#: byte per batch (a structure that keeps 8 bytes a batch would show
#: megabytes), far above the allocator's noise.
FLAT_BYTES = 64 << 10


#: What a structure's size leaves out: code and types are shared, not kept per batch.
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def deep_size(root) -> int:
    """Bytes of ``root`` and of every object it reaches (each once),
    leaving out code, types and modules."""
    seen, stack, total = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def grown_size(structure, run, first: int, second: int) -> int:
    """How much ``structure`` grew from ``run(first)`` to ``run(second)``;
    ``run(n)`` drives it until n batches have passed."""
    run(first)
    before = deep_size(structure)
    run(second)
    return deep_size(structure) - before


def grown_bytes(run, first: int, second: int) -> int:
    """Traced memory after ``run(second)`` minus after ``run(first)``
    (everything this process allocated meanwhile and still holds)."""
    gc.collect()
    tracemalloc.start()
    try:
        run(first)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        run(second)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def driven(step):
    """A ``run(n)`` that calls ``step(k)`` for every batch k up to n."""
    done = [0]

    def run(n: int) -> None:
        for k in range(done[0], n):
            step(k)
        done[0] = n

    return run


@pytest.mark.parametrize("in_order", [True, False])
def test_the_reorder_buffer_holds_only_batches_in_flight(in_order):
    buffer = ReorderBuffer(in_order)
    in_flight = 4

    def step(k: int) -> None:
        # Batches finish a few places out of order; every 1000th is retired
        # (a copy of an iterable that ran out), the rest arrive.
        j = k ^ 1
        if j % 1000 == 0:
            buffer.retire(j)
        else:
            buffer.put(j, ("batch", j))
        if k >= in_flight:
            buffer.take()

    grown = grown_size(buffer, driven(step), MILLION // 5, MILLION)
    assert grown < FLAT_BYTES, f"the reorder buffer grew {grown} bytes over {MILLION * 4 // 5} batches"
    assert len(buffer) <= in_flight + 2


def test_the_workers_progress_through_an_iterable_stays_flat():
    progress = IterableProgress(num_workers=3)

    def step(k: int) -> None:
        progress.delivered(k % 3, CopyState(None, {"read": k}, False, k))

    grown = grown_size(progress, driven(step), MILLION // 5, MILLION)
    assert grown < FLAT_BYTES, f"the iterable's progress grew {grown} bytes"
    assert progress.snapshot().states[0] == CopyState(None, {"read": MILLION - 1}, False, MILLION - 1)


@pytest.mark.parametrize("in_order", [True, False])
def test_the_epoch_progress_keeps_only_batches_delivered_ahead(in_order):
    progress = EpochProgress(epoch=0, base_seed=1, sampler_state=None, generator_state=None)

    def step(k: int) -> None:
        progress.delivered(k ^ 1 if not in_order else k)  # (out of order: pairs swapped)

    grown = grown_size(progress, driven(step), MILLION // 5, MILLION)
    assert grown < FLAT_BYTES, f"the epoch's progress grew {grown} bytes"
    assert progress.position == MILLION and not progress.delivered_ahead


def test_the_stats_recorder_keeps_a_bounded_window():
    recorder = StatsRecorder(num_workers=2)
    pass_id = recorder.begin_pass(0.0, None, 2)
    record = Delivered(0, timings=Timings.make(samples=4, fetch_s=1e-4, collate_s=1e-5, worker_id=0, worker_pid=1))
    clock = itertools.count()

    def step(k: int) -> None:
        now = next(clock) * 1e-4
        recorder.batch(pass_id, record, now, now + 1e-5)

    # (the recorder keeps the latest WINDOW to 2 x WINDOW batches for its
    # percentiles: measured at two points a whole number of WINDOWs apart)
    grown = grown_size(recorder, driven(step), MILLION - 8 * WINDOW, MILLION)
    assert grown < FLAT_BYTES, f"the stats recorder grew {grown} bytes"
    assert recorder.snapshot().batches == MILLION


class Endless(conveyor.IterableDataset):
    def __iter__(self):
        return itertools.count()


@pytest.mark.timeout(300)
def test_a_loader_over_an_endless_stream_keeps_flat_memory():
    """The whole main-process path (plan, executor, reorder, progress,
    delivery) of a loader with workers, between batch 2,000 and 12,000."""
    loader = conveyor.DataLoader(Endless(), batch_size=None, num_workers=2, collect_stats=False)
    batches = iter(loader)

    def run(n: int) -> None:
        while run.done < n:
            next(batches)  # noqa: F821  (a closure over a name deleted below)
            run.done += 1

    run.done = 0
    grown = grown_bytes(run, 2_000, 12_000)
    del batches
    gc.collect()
    assert grown < FLAT_BYTES, f"the loader's main process grew {grown} bytes over 10,000 batches"
