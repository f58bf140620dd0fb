"""How an epoch's first batch is started: under fork, worker 0 alone is
forked when the loader starts and the others once the first task is in its
pipe (workers/fleet.py); while an epoch's first batch fills its images with
a thread per core, the other workers hold their own first batch until it is
done (StopFlag.filling, held at most FIRST_BATCH_HOLD_S)."""

from __future__ import annotations

import errno
import functools
import os
import time
import types

import numpy as np
import pytest

import conveyor
import procutil
from conveyor._engine.executor.dispatch import FIRST_BATCH_FILL_THREADS
from conveyor._engine.loading.rows import RowPlacer
from conveyor._engine.transport import slots
from conveyor._engine.transport.slots import StopFlag
from conveyor._engine.workers import fleet
from conveyor.collate import register_collate

pytestmark = pytest.mark.timeout(120)

WAIT_S = 60.0


def record_worker(log_dir: str, worker_id: int) -> None:
    """worker_init_fn: leave ``<log_dir>/worker<id>`` holding this worker's pid."""
    path = os.path.join(log_dir, f"worker{worker_id}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def started(log_dir, count: int) -> list[int]:
    """Ids of workers 0..count-1 that ran worker_init_fn, once worker 0 has."""
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(os.path.join(str(log_dir), "worker0")) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [wid for wid in range(count) if os.path.exists(os.path.join(str(log_dir), f"worker{wid}"))]


def new_workers(before: set) -> list[int]:
    return sorted(procutil.new_descendants(before))


def test_under_fork_worker_0_starts_with_the_loader_and_the_others_with_the_first_task(tmp_path):
    before = procutil.pids()
    loader = conveyor.DataLoader(
        list(range(12)),
        batch_size=2,
        num_workers=3,
        multiprocessing_context="fork",
        worker_init_fn=functools.partial(record_worker, str(tmp_path)),
    )
    it = iter(loader)
    assert started(tmp_path, 3) == [0]
    assert len(new_workers(before)) == 1  # only worker 0's process so far
    assert next(it).tolist() == [0, 1]
    assert started(tmp_path, 3) == [0, 1, 2]  # (the first batch waits for every worker to be ready)
    assert [b.tolist() for b in it] == [[2 * k, 2 * k + 1] for k in range(1, 6)]
    del it, loader


def test_spawned_workers_start_with_the_loader(tmp_path):
    """Spawned workers get their config ahead of any task in their pipe:
    every worker starts in iter(loader). (With a pin thread under fork:
    test_pin_memory.py.)"""
    before = procutil.pids()
    loader = conveyor.DataLoader(
        list(range(8)),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=functools.partial(record_worker, str(tmp_path)),
    )
    it = iter(loader)
    deadline = time.monotonic() + WAIT_S
    while len(new_workers(before)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(new_workers(before)) == 2
    assert [b.tolist() for b in it] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    del it, loader


def test_an_iterator_dropped_before_its_first_batch_leaves_no_process_and_no_descriptor():
    """The workers not started yet have pipes and stack files: closed with the
    pool (the autouse leak check also counts descriptors)."""
    before = procutil.pids()
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers=3, multiprocessing_context="fork")
    it = iter(loader)
    del it, loader
    assert not procutil.wait_until_gone(procutil.new_descendants(before), timeout_s=WAIT_S)


def test_a_worker_that_cannot_start_after_the_first_task_fails_the_pass(monkeypatch):
    """Forking worker 1 fails (as fork does when the system is out of
    processes): next() raises that error, every worker is stopped, and the
    iterator raises it again."""
    real = fleet.start_worker

    def start_worker(method, config, *args):
        if config.worker_id == 1:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(method, config, *args)

    monkeypatch.setattr(fleet, "start_worker", start_worker)
    before = procutil.pids()
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    with pytest.raises(OSError, match="Resource temporarily unavailable") as caught:
        next(it)
    assert caught.value.errno == errno.EAGAIN
    assert not procutil.wait_until_gone(procutil.new_descendants(before), timeout_s=WAIT_S)
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        next(it)
    del it, loader, caught


# ------------------------------------------------------------- the hold
class Filled:
    shape, dtype = (2, 2), np.dtype(np.uint8)

    def __init__(self, value: int):
        self.value = value

    def fill_into(self, out: np.ndarray) -> None:
        out[...] = self.value

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.full(self.shape, self.value, dtype or self.dtype)


# (where no row placement runs, num_workers=0: made into arrays, then collated)
register_collate(Filled, lambda batch, *, collate: collate([np.asarray(sample) for sample in batch]))


class Writer:
    def allocate(self, shape, dtype):
        return np.empty(shape, dtype)


@pytest.fixture
def flags():
    flag = StopFlag()
    yield flag
    flag.close()


def test_the_first_batch_says_it_fills_with_every_core_only_when_it_has_leaves_that_fill_themselves(flags):
    plain = RowPlacer(Writer(), 2, fill_threads=2, flags=flags)
    plain.place(np.zeros((2, 2), np.uint8), 0)
    assert not flags.wait_while_filling(0.0)  # plain arrays: nobody is held
    later = RowPlacer(Writer(), 2, fill_threads=1, flags=flags)
    later.place(Filled(1), 0)  # a later batch (one fill thread) says nothing
    assert not flags.wait_while_filling(0.0)
    first = RowPlacer(Writer(), 2, fill_threads=2, flags=flags)
    first.place(Filled(1), 0)
    started_at = time.monotonic()
    assert not flags.wait_while_filling(0.05)  # set: a holder waits, bounded
    assert time.monotonic() - started_at >= 0.05
    flags.filling(False)
    assert not flags.wait_while_filling(5.0)  # cleared: no wait at all


def test_a_held_worker_goes_on_once_the_first_batch_is_done_or_the_loader_stops(flags):
    """Across processes: a forked child holds while the flag is up, and
    answers True once it is cleared; the stop flag ends the hold with False.
    The flag is cleared (or the stop raised) only once the child says it is
    inside the hold (each of its polls writes "W"), whatever the machine's speed."""
    for end_with_stop in (False, True):
        flags.filling(True)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the held worker
            os.close(read_fd)
            try:
                real_sleep = time.sleep

                def sleep(seconds):
                    os.write(write_fd, b"W")
                    real_sleep(seconds)

                slots.time = types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep)  # (the child's copy only)
                waited = flags.wait_while_filling(WAIT_S)
                os.write(write_fd, b"T" if waited else b"F")
            finally:
                os._exit(0)
        os.close(write_fd)
        assert os.read(read_fd, 1) == b"W"  # it holds
        if end_with_stop:
            flags.set()
        else:
            flags.filling(False)
        answer = b"W"
        while answer == b"W":
            answer = os.read(read_fd, 1)
        os.close(read_fd)
        os.waitpid(pid, 0)
        assert answer == (b"F" if end_with_stop else b"T")


class Images:
    """Samples whose image fills itself, decoded from the index: the same
    pixels however many workers and whichever holds."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return Filled(i % 251), i


@pytest.mark.parametrize("persistent", [False, True])
def test_batches_are_the_same_with_the_hold_for_any_number_of_workers(persistent):
    def epochs(workers: int) -> list:
        loader = conveyor.DataLoader(
            Images(40),
            batch_size=4,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            persistent_workers=persistent and workers > 0,
        )
        return [[(images.tolist(), labels.tolist()) for images, labels in loader] for _ in range(2)]

    expected = epochs(0)
    for workers in (1, 2, 3):
        assert epochs(workers) == expected


def test_the_workers_start_time_leaves_out_the_wait_between_iter_and_the_first_next():
    """worker_start_s counts only the time conveyor spent starting them: all
    of it lies within iter() and the first next(), however long the loop
    waited between the two."""
    loader = conveyor.DataLoader(
        list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="fork", collect_stats=True
    )
    called = time.perf_counter()
    it = iter(loader)
    in_iter = time.perf_counter() - called
    time.sleep(0.5)  # (the loop doing something else)
    called = time.perf_counter()
    next(it)
    in_next = time.perf_counter() - called
    list(it)
    started = loader.stats().worker_start_s
    assert started is not None and 0 < started <= in_iter + in_next


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def _note(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.monotonic()))  # (CLOCK_MONOTONIC: one clock for every process of the machine)
    os.replace(path + ".tmp", path)


def _noted(path) -> float:
    return float(open(path).read())


class SlowFirst(Filled):
    """Sample 0's image fills slowly, and only once worker 1 is up: worker 1's
    first batch would run meanwhile if it did not hold."""

    def __init__(self, value: int, log_dir: str):
        super().__init__(value)
        self.log_dir = log_dir

    def fill_into(self, out: np.ndarray) -> None:
        if self.value == 0:
            _note(os.path.join(self.log_dir, "filling0"))  # (the flag is up by now: raised before any fill)
            _wait_for(os.path.join(self.log_dir, "worker1"))
            time.sleep(0.3)
        super().fill_into(out)
        if self.value == 0:
            _note(os.path.join(self.log_dir, "filled0"))


class TimedImages:
    def __init__(self, log_dir: str):
        self.log_dir = log_dir

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        _note(os.path.join(self.log_dir, f"get{i}"))
        return SlowFirst(i, self.log_dir), i


def start_after_the_first_fill(log_dir: str, worker_id: int) -> None:
    """worker_init_fn: worker 1 comes up only once worker 0 fills (its flag up)."""
    if worker_id == 1:
        _wait_for(os.path.join(log_dir, "filling0"))
    record_worker(log_dir, worker_id)


@pytest.mark.skipif(
    FIRST_BATCH_FILL_THREADS < 2, reason="one core: the first batch fills with one thread and raises no flag"
)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_another_worker_holds_its_first_batch_until_the_first_is_done(tmp_path, method):
    """Under fork and spawn alike (the flag's page travels to spawned workers):
    worker 1 starts its first batch only once worker 0's is done."""
    log_dir = str(tmp_path)
    loader = conveyor.DataLoader(
        TimedImages(log_dir),
        batch_size=2,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=functools.partial(start_after_the_first_fill, log_dir),
    )
    batches = [labels.tolist() for _, labels in loader]
    assert batches == [[0, 1], [2, 3]]
    assert _noted(tmp_path / "get2") >= _noted(tmp_path / "filled0")
