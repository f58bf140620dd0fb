"""Every place where bytes cross between the main process and a worker
(issue 8: no hang, no lost error).

Each test drives one boundary into failure (or into the size that used to
deadlock it) and checks what a user would notice: the exception type, that
the message names the worker, its pid, the batch and its sample indices,
that ``__cause__`` is the original exception, that a broken loader raises
the same error again at once, that iteration goes on where it should; and
that no worker process is left behind.

    main ──task pickle──▶ pipe ──task unpickle──▶ worker         1 (sampler output that does not pickle)
    main ◀──result unpickle── pipe ◀──result pickle── worker    2, 3, 6 (collate output; a crash mid-write)
    main: shared-memory views → torch tensors                    4 (conversion error, differential vs torch)
    main ──config (spawn, forkserver)──▶ worker start-up         5 (dataset.__setstate__ raises)
    worker ──shared-memory slot──▶ main                          7, 8 (slot cannot grow; no shared memory at all)
    both pipes full at once                                      9 (sizes that used to deadlock)
    the user's own os.fork()                                     10
    user code in the worker                                      11 (__getitem__, __iter__, collate_fn,
                                                                     worker_init_fn, load_state_dict,
                                                                     SystemExit, KeyboardInterrupt)
    waiting                                                      12 (stall warning), 13 (a ready batch
                                                                     is not held back), 14 (timeout=)

Every test runs under "fork" and "spawn" (a boundary that exists under one
start method only says so). Samples that must be waited for wait for a file
the test creates, never for a duration, and nothing asserts a duration.
``dataset.__len__`` is left out of the list in 11: the engine never calls it
in a worker (only the main process's sampler does).
"""

from __future__ import annotations

import array
import errno
import fcntl
import functools
import gc
import json
import linecache
import mmap
import multiprocessing.util
import os
import re
import resource
import signal
import subprocess
import sys
import termios
import threading
import time
import traceback
import warnings
import weakref

import numpy as np
import pytest

import conveyor
import procutil
from conveyor._engine.errors import TransportError, WorkerDiedError
from conveyor._engine.executor.watchdog import StallWarning
from toy_datasets import SlowAt1, Squares

pytestmark = pytest.mark.timeout(60)

METHODS = ["fork", "spawn"]

#: A cap on every wait for a file or a process in this module: far beyond
#: what any of them needs, below the test timeout, so that a bug shows as a
#: failed assertion with a message rather than as a hang.
WAIT_CAP_S = 30.0


# ------------------------------------------------------------------ helpers
def record_worker(log_dir: str, worker_id: int) -> None:
    """worker_init_fn: leave ``<log_dir>/worker<id>`` holding this worker's pid."""
    _write(os.path.join(log_dir, f"worker{worker_id}"), str(os.getpid()))


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _wait_for_file(path: str, cap_s: float = WAIT_CAP_S) -> bool:
    deadline = time.monotonic() + cap_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def worker_pid(log_dir, wid: int) -> int:
    """The pid worker ``wid`` recorded with ``record_worker`` (waits for it)."""
    path = os.path.join(str(log_dir), f"worker{wid}")
    assert _wait_for_file(path), f"worker {wid} never ran worker_init_fn"
    return int(open(path).read())


def worker_pids(log_dir, count: int) -> dict[int, int]:
    """{worker id: pid} for workers 0..count-1 (waits until all are there)."""
    return {wid: worker_pid(log_dir, wid) for wid in range(count)}


def recorder(log_dir) -> functools.partial:
    return functools.partial(record_worker, str(log_dir))


def assert_no_worker_left(before: dict) -> None:
    left = procutil.leaked(before, timeout_s=5.0)
    assert not left, "worker processes left behind: " + "; ".join(
        f"pid {pid} ({procutil.describe(pid, st)})" for pid, st in left.items()
    )


def take_until_error(iterator, error_type, limit: int = 100):
    """(batches delivered, the error raised) — next() until it raises ``error_type``."""
    delivered = []
    for _ in range(limit):
        try:
            delivered.append(next(iterator))
        except error_type as exc:
            return delivered, exc
    raise AssertionError(f"no {error_type.__name__} after {limit} batches")


def outcomes(iterator, limit: int = 100) -> list:
    """Each next(): the batch (as a list) or the exception it raised; "stop" at the end."""
    seen = []
    for _ in range(limit):
        try:
            batch = next(iterator)
        except StopIteration:
            seen.append("stop")
            return seen
        except Exception as exc:
            seen.append(exc)
            continue
        seen.append(_plain(batch))
    raise AssertionError(f"still iterating after {limit} batches: {seen[-3:]}")


def _plain(batch):
    if hasattr(batch, "tolist"):
        return batch.tolist()
    if isinstance(batch, (list, tuple)):
        return [_plain(b) for b in batch]
    return batch


def assert_raises_same_again(iterator, first: BaseException) -> None:
    """A broken loader raises the same error (type, message, cause type) at the next next()."""
    with pytest.raises(type(first)) as again:
        next(iterator)
    assert str(again.value) == str(first)
    assert type(again.value.__cause__) is type(first.__cause__)


def squares(indices) -> list:
    return [i * i for i in indices]


# --------------------------------------------------------------- user code
class BoundaryError(Exception):
    """An exception class of the user's own."""


class UnprintableError(Exception):
    """Its ``__str__`` raises."""

    def __str__(self):
        raise RuntimeError("this exception cannot be printed")


class LockedError(Exception):
    """Its instance holds a lock, so it cannot be pickled; the class can."""


class Ints:
    """Map-style: sample i is i (an int)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def identity(batch):
    return batch


# ============================================================ 1. task pickle
class RefusesPickling:
    """An index object whose ``__reduce__`` raises."""

    def __reduce__(self):
        raise ValueError("this index refuses to be pickled")

    def __repr__(self):
        return "<RefusesPickling>"


class SamplerWithLock:
    """A sampler (one index per sample) whose 11th index is a list holding a lock."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            yield [i, threading.Lock()] if i == 11 else i


class BatchSamplerWithUnpicklable:
    """A batch sampler whose batch 5 holds an index that refuses to be pickled."""

    def __len__(self):
        return 8

    def __iter__(self):
        for b in range(8):
            yield [2 * b, RefusesPickling()] if b == 5 else [2 * b, 2 * b + 1]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("source", ["sampler", "batch_sampler"])
def test_a_task_that_cannot_be_pickled_breaks_the_loader_naming_batch_worker_and_cause(tmp_path, method, source):
    """The sampler's output for batch 5 cannot be pickled into a task (a lock
    inside an index from a sampler; an index whose __reduce__ raises from a
    batch_sampler): TransportError naming the batch, its indices, the worker
    and its pid, with the pickling error as cause; the loader is broken."""
    before = procutil.descendants()
    if source == "sampler":
        loader = conveyor.DataLoader(
            Squares(16),
            batch_size=2,
            sampler=SamplerWithLock(16),
            num_workers=2,
            multiprocessing_context=method,
            worker_init_fn=recorder(tmp_path),
        )
        cause_type, cause_text = TypeError, "cannot pickle '_thread.lock' object"
    else:
        loader = conveyor.DataLoader(
            Squares(16),
            batch_sampler=BatchSamplerWithUnpicklable(),
            num_workers=2,
            multiprocessing_context=method,
            worker_init_fn=recorder(tmp_path),
        )
        cause_type, cause_text = ValueError, "this index refuses to be pickled"
    it = iter(loader)
    delivered, err = take_until_error(it, TransportError)

    assert isinstance(err, RuntimeError)
    found = re.search(
        r"could not send the task of batch 5 \(sample indices \[10, (.+?)\]\) for worker (\d) \(pid (\d+)\)", str(err)
    )
    assert found, str(err)
    assert int(found.group(3)) == worker_pid(tmp_path, int(found.group(2)))
    assert isinstance(err.__cause__, cause_type) and cause_text in str(err.__cause__)
    assert cause_text in str(err)
    # What came before the bad batch came in order and intact.
    assert [b.tolist() for b in delivered] == [squares([2 * k, 2 * k + 1]) for k in range(len(delivered))]
    assert len(delivered) <= 5
    assert_no_worker_left(before)
    assert_raises_same_again(it, err)
    del it, loader, err
    assert_no_worker_left(before)


# ========================================================== 2. result pickle
def collate_some_unpicklable(samples):
    """Batch [2, 3] comes out holding a lock, batch [6, 7] a generator."""
    if 2 in samples:
        return {"values": samples, "lock": threading.Lock()}
    if 6 in samples:
        return {"values": samples, "gen": (s for s in samples)}
    return samples


@pytest.mark.parametrize("method", METHODS)
def test_a_result_that_cannot_be_pickled_fails_its_batch_and_iteration_goes_on(tmp_path, method):
    """A collate_fn output that cannot be pickled in the worker (a lock, a
    generator): that batch raises TypeError naming worker, pid, batch and
    indices (the torch words first); the other batches arrive, as torch
    does for a per-batch error."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(
        Ints(10),
        batch_size=2,
        num_workers=2,
        collate_fn=collate_some_unpicklable,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    seen = outcomes(iter(loader))
    pids = worker_pids(tmp_path, 2)

    assert [s if not isinstance(s, BaseException) else "error" for s in seen] == [
        [0, 1],
        "error",
        [4, 5],
        "error",
        [8, 9],
        "stop",
    ]
    for err, batch, indices, what in ((seen[1], 1, "[2, 3]", "'_thread.lock'"), (seen[3], 3, "[6, 7]", "'generator'")):
        assert type(err) is TypeError
        text = str(err)
        found = re.match(
            r"Caught TypeError in DataLoader worker process (\d) while sending its result to the main process\.", text
        )
        assert found, text
        wid = int(found.group(1))
        assert f"(conveyor: worker pid {pids[wid]}, batch {batch}, sample indices {indices})" in text
        assert "Original Traceback" in text and f"cannot pickle {what} object" in text
        assert err.batch_index == batch
    assert_no_worker_left(before)


# ======================================================== 3. result unpickle
_MAIN_PID_VAR = "CONVEYOR_TEST_BOUNDARIES_MAIN_PID"


def _rebuild_unless_in_main(values):
    if str(os.getpid()) == os.environ.get(_MAIN_PID_VAR):
        raise ValueError("this result cannot be rebuilt in the main process")
    return values


class RebuildsOnlyInWorkers:
    """Pickles fine anywhere; unpickling raises in the main process only."""

    def __init__(self, values):
        self.values = values

    def __reduce__(self):
        return _rebuild_unless_in_main, (self.values,)


def collate_unreadable_at_2(samples):
    return RebuildsOnlyInWorkers(samples) if 2 in samples else samples


@pytest.mark.parametrize("method", METHODS)
def test_a_result_that_cannot_be_unpickled_breaks_the_loader_naming_batch_worker_and_cause(
    tmp_path, monkeypatch, method
):
    """The result of batch 1 pickles in the worker but raises while the main
    process unpickles it: TransportError "could not read the result of batch
    1 (sample indices [2, 3]) from worker W (pid P)", the unpickling error as
    cause; the loader is broken."""
    monkeypatch.setenv(_MAIN_PID_VAR, str(os.getpid()))
    before = procutil.descendants()
    loader = conveyor.DataLoader(
        Ints(10),
        batch_size=2,
        num_workers=2,
        collate_fn=collate_unreadable_at_2,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    it = iter(loader)
    delivered, err = take_until_error(it, TransportError)

    assert delivered in ([], [[0, 1]])
    found = re.search(
        r"could not read the result of batch 1 \(sample indices \[2, 3\]\) from worker (\d) \(pid (\d+)\)", str(err)
    )
    assert found, str(err)
    assert int(found.group(2)) == worker_pid(tmp_path, int(found.group(1)))
    assert isinstance(err.__cause__, ValueError)
    assert "cannot be rebuilt in the main process" in str(err.__cause__)
    assert_no_worker_left(before)
    assert_raises_same_again(it, err)
    del it, loader, err
    assert_no_worker_left(before)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("boundary", ["task pickle", "result unpickle"])
def test_a_loader_broken_at_a_boundary_can_be_garbage_collected(tmp_path, monkeypatch, method, boundary):
    """Once the user drops a loader whose task could not be pickled (or whose
    result could not be unpickled), and the error, the iterator is garbage:
    nothing of the broken loader (its shared-memory descriptors) stays. The
    chained cause's traceback would hold the frames of the next() that broke
    the loader; its text is in the message instead."""
    monkeypatch.setenv(_MAIN_PID_VAR, str(os.getpid()))
    if boundary == "task pickle":
        loader = conveyor.DataLoader(
            Squares(16), batch_sampler=BatchSamplerWithUnpicklable(), num_workers=2, multiprocessing_context=method
        )
    else:
        loader = conveyor.DataLoader(
            Ints(10), batch_size=2, num_workers=2, collate_fn=collate_unreadable_at_2, multiprocessing_context=method
        )
    it = iter(loader)
    err = take_until_error(it, TransportError)[1]  # (the batches before it are views on shared memory: not kept)
    message = str(err)
    iterator_alive = weakref.ref(it)
    del it, loader, err
    gc.collect()
    collected = iterator_alive() is None  # (not inside the assert: pytest would keep the iterator)
    assert collected, "the broken loader's iterator is never collected"
    assert "Where it failed" in message and ("__reduce__" in message or "_rebuild_unless_in_main" in message), message


# ======================================================= 4. conversion error
class Dates:
    """numpy.datetime64 samples, as scalars (no collate takes them) or as
    arrays (numpy collates them; torch cannot hold them)."""

    def __init__(self, shape: str):
        self.shape = shape

    def __len__(self):
        return 6

    def __getitem__(self, i):
        day = np.datetime64("2024-01-01") + np.timedelta64(i, "D")
        return day if self.shape == "scalar" else np.array([day, day])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", ["scalar", "array"])
def test_a_batch_that_cannot_become_tensors_raises_typeerror_each_time_like_torch(method, shape):
    """Differential against torch.utils.data on the same datetime64 dataset:
    each batch raises TypeError and the epoch then ends. Scalars fail in the
    worker's collate; arrays collate in the worker (into shared memory) and
    fail in the main process, where the views become tensors: torch's own
    message, with a note naming the batch, its indices and the worker."""
    import torch.utils.data as tud

    import conveyor.torch as data

    before = procutil.descendants()
    theirs = outcomes(iter(tud.DataLoader(Dates(shape), batch_size=2)))
    ours = outcomes(iter(data.DataLoader(Dates(shape), batch_size=2, num_workers=2, multiprocessing_context=method)))

    def kinds(seen):
        return [type(s).__name__ if isinstance(s, BaseException) else s for s in seen]

    assert kinds(ours) == kinds(theirs) == ["TypeError"] * 3 + ["stop"]
    for k, (err, torch_err) in enumerate(zip(ours[:3], theirs[:3])):
        context = str(err) + "\n".join(getattr(err, "__notes__", []))
        assert re.search(rf"batch {k}\b.*sample indices \[{2 * k}, {2 * k + 1}\]", context), context
        if shape == "array":
            assert str(err) == str(torch_err)  # torch's own words
            assert re.search(r"from worker \d \(pid \d+\) into torch tensors", context), context
    assert_no_worker_left(before)


# ========================================================= 5. config unpickle
class ConfigError(Exception):
    pass


class OpensOnlyWhereMade(Squares):
    """Squares whose unpickling raises in any process but the one that made it."""

    def __init__(self, n):
        super().__init__(n)
        self.maker = os.getpid()

    def __getstate__(self):
        return {"n": self.n, "maker": self.maker}

    def __setstate__(self, state):
        if os.getpid() != state["maker"]:
            raise ConfigError(f"cannot reopen the dataset in process {os.getpid()}")
        self.__dict__.update(state)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_dataset_that_fails_to_unpickle_in_the_worker_raises_its_own_error(method):
    """Only under spawn and forkserver (fork inherits the config, nothing is
    unpickled): the dataset's __setstate__ raises in the worker. The user gets
    ConfigError, "Caught ConfigError in DataLoader worker process W. (conveyor:
    while starting worker W, pid P)" and the worker's traceback; the loader is
    broken."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(OpensOnlyWhereMade(8), batch_size=2, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    with pytest.raises(ConfigError) as caught:
        next(it)
    err = caught.value
    text = str(err)
    found = re.match(
        r"Caught ConfigError in DataLoader worker process (\d)\. \(conveyor: while starting worker (\d), pid (\d+)\)",
        text,
    )
    assert found, text
    assert found.group(1) == found.group(2) and int(found.group(3)) != os.getpid()
    assert "Original Traceback" in text and "__setstate__" in text and "cannot reopen the dataset" in text
    assert isinstance(err.__cause__, ConfigError)
    assert_no_worker_left(before)
    assert_raises_same_again(it, err)
    del it, loader, err, caught
    assert_no_worker_left(before)


# ============================================= 6. a crash in the middle of a write
def _a_pipe_this_process_writes_is_full() -> bool:
    """Whether a pipe this process holds the write end of is (all but) full:
    the worker is then blocked in the middle of writing its result."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                continue
            with open(f"/proc/self/fdinfo/{name}") as f:
                flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
            if flags & os.O_ACCMODE != os.O_WRONLY:
                continue
            fd = int(name)
            waiting = array.array("i", [0])
            fcntl.ioctl(fd, termios.FIONREAD, waiting)
            if waiting[0] >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) - mmap.PAGESIZE:
                return True
        except (OSError, StopIteration, ValueError):
            continue
    return False


def _kill_me_once_my_result_pipe_is_full() -> None:
    deadline = time.monotonic() + WAIT_CAP_S
    while time.monotonic() < deadline and not _a_pipe_this_process_writes_is_full():
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


BIG_RESULT_BYTES = 20 << 20


def collate_big_then_die_at_1(samples):
    """Batch [1] is a 20 MB bytes object (it travels inline, through the
    pipe); a thread kills the worker once the pipe is full mid-write."""
    if samples == [1]:
        threading.Thread(target=_kill_me_once_my_result_pipe_is_full, daemon=True).start()
        return b"x" * BIG_RESULT_BYTES
    return samples


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_killed_in_the_middle_of_writing_a_result_is_reported(tmp_path, method):
    """Batch 1's result (20 MB, inline) fills the result pipe while the main
    process is not reading; the worker is SIGKILLed mid-write. The next
    next() raises WorkerDiedError "is killed by signal: Killed" naming the
    worker, its pid and batch 1: no hang on the half-written frame."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(
        Ints(4),
        batch_size=1,
        num_workers=1,
        collate_fn=collate_big_then_die_at_1,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    it = iter(loader)
    assert next(it) == [0]
    pid = worker_pids(tmp_path, 1)[0]
    assert not procutil.wait_until_gone([pid], WAIT_CAP_S), "the worker was never killed"
    with pytest.raises(WorkerDiedError) as caught:
        next(it)
    err = caught.value
    text = str(err)
    assert f"DataLoader worker (pid {pid}) is killed by signal: Killed." in text
    assert "worker 0" in text and "It was sending the result of batch 1 (sample indices [1])" in text
    assert_no_worker_left(before)
    assert_raises_same_again(it, err)
    del it, loader, err, caught
    assert_no_worker_left(before)


# =================================================================== 7. slot full
class Images:
    """Sample i: a 64×64 float32 image filled with i (16 KiB; a batch of 8 is 128 KiB)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((64, 64), i, np.float32)


def record_then_cap_file_size(log_dir: str, worker_id: int) -> None:
    """worker_init_fn: no file this worker writes may grow beyond 64 KiB, so
    a shared-memory slot cannot grow (ftruncate fails with EFBIG, SIGXFSZ
    ignored)."""
    record_worker(log_dir, worker_id)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))


@pytest.mark.parametrize("method", METHODS)
def test_a_slot_that_cannot_grow_sends_batches_inline_with_one_warning(tmp_path, method):
    """The workers' shared-memory slots cannot grow: every batch travels
    inline instead, one UserWarning says so, and the batches are exactly
    those of num_workers=0."""
    before = procutil.descendants()
    expected = [b.tolist() for b in conveyor.DataLoader(Images(48), batch_size=8)]
    loader = conveyor.DataLoader(
        Images(48),
        batch_size=8,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=functools.partial(record_then_cap_file_size, str(tmp_path)),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [b.tolist() for b in loader]
    assert got == expected
    assert [w.category for w in caught] == [UserWarning], [str(w.message) for w in caught]
    text = str(caught[0].message)
    assert re.search(r"shared.memory", text) and "travel through pipes" in text
    assert_no_worker_left(before)


# ======================================================= 8. no shared memory
@pytest.mark.parametrize("method", METHODS)
def test_without_shared_memory_batches_travel_through_pipes_with_a_warning(monkeypatch, method):
    """memfd_create and its fallback shm_open both fail in the main process:
    one warning that batches travel through pipes, and every batch is right."""
    import _posixshmem

    def unavailable(*args, **kwargs):
        raise OSError(errno.ENOSYS, "not available here")

    before = procutil.descendants()
    expected = [b.tolist() for b in conveyor.DataLoader(Images(48), batch_size=8)]
    monkeypatch.setattr(os, "memfd_create", unavailable)
    monkeypatch.setattr(_posixshmem, "shm_open", unavailable)
    loader = conveyor.DataLoader(Images(48), batch_size=8, num_workers=2, multiprocessing_context=method)
    with pytest.warns(UserWarning, match="batches travel through pipes"):
        got = [b.tolist() for b in loader]
    assert got == expected
    assert_no_worker_left(before)


# ======================================================= 9. pipe deadlock sizes
class Strings:
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return f"s{i}"


class FastSquares(Squares):
    """Squares with ``__getitems__``: one call per batch (big batches stay cheap)."""

    def __getitems__(self, indices):
        return [i * i for i in indices]


class FastInts(Ints):
    def __getitems__(self, indices):
        return list(indices)


class LongBatches:
    """A batch sampler of very long index lists (~2.5 MB pickled each)."""

    def __init__(self, batches: int, size: int):
        self.batches, self.size = batches, size

    def __len__(self):
        return self.batches

    def __iter__(self):
        for k in range(self.batches):
            yield list(range(k * self.size, (k + 1) * self.size))


@pytest.mark.parametrize("method", METHODS)
def test_many_big_tasks_and_big_inline_results_in_flight_do_not_deadlock(method):
    """batch_size=40_000 strings, prefetch_factor=8, identity collate: task
    and result pipes full at once, on both workers; every batch arrives."""
    before = procutil.descendants()
    size, batches = 40_000, 18  # (the window holds 16)
    loader = conveyor.DataLoader(
        Strings(size * batches),
        batch_size=size,
        num_workers=2,
        prefetch_factor=8,
        collate_fn=identity,
        multiprocessing_context=method,
    )
    count = 0
    for k, batch in enumerate(loader):
        assert batch == [f"s{i}" for i in range(k * size, (k + 1) * size)]
        count += 1
    assert count == batches
    assert_no_worker_left(before)


@pytest.mark.parametrize("method", METHODS)
def test_holding_every_big_batch_sends_the_rest_through_pipes_correctly(method):
    """batch_size=300_000 ints, every batch kept: the shared-memory slots run
    out and the later 2.4 MB batches travel through the pipes; all correct."""
    before = procutil.descendants()
    size, batches = 300_000, 10
    loader = conveyor.DataLoader(
        FastSquares(size * batches), batch_size=size, num_workers=2, prefetch_factor=1, multiprocessing_context=method
    )
    held = list(loader)
    assert len(held) == batches
    for k, batch in enumerate(held):
        expected = np.arange(k * size, (k + 1) * size, dtype=np.int64) ** 2
        np.testing.assert_array_equal(batch, expected)
    assert_no_worker_left(before)


def collate_to_bytes(samples):
    """The batch as one bytes object (8 bytes per sample): it travels inline, in the pipe."""
    return array.array("q", samples).tobytes()


@pytest.mark.parametrize("method", METHODS)
def test_multi_megabyte_tasks_with_multi_megabyte_results_do_not_deadlock(method):
    """A batch sampler of 500_000-index lists (~2.5 MB per pickled task) and
    results of 4 MB each (a bytes object, inline): both directions of both
    pipes carry more than they hold at once; every batch arrives."""
    before = procutil.descendants()
    size, batches = 500_000, 12
    loader = conveyor.DataLoader(
        FastInts(size * batches),
        batch_sampler=LongBatches(batches, size),
        num_workers=2,
        prefetch_factor=4,
        collate_fn=collate_to_bytes,
        multiprocessing_context=method,
    )
    count = 0
    for k, batch in enumerate(loader):
        assert type(batch) is bytes
        np.testing.assert_array_equal(np.frombuffer(batch, np.int64), np.arange(k * size, (k + 1) * size))
        count += 1
    assert count == batches
    assert_no_worker_left(before)


# ================================================================ 10. forked child
def _next_in_child(it) -> str:
    """What next() on the parent's iterator does in a forked child."""
    try:
        next(it)
    except RuntimeError as exc:
        return str(exc)
    except BaseException as exc:  # noqa: BLE001  (reported to the parent)
        return f"{type(exc).__name__}: {exc}"
    return "returned a batch"


@pytest.mark.parametrize("method", METHODS)
def test_a_forked_child_neither_uses_nor_stops_its_parents_workers(method):
    """After one batch, the test process forks. The child's next() on the
    inherited iterator raises RuntimeError (the iterator belongs to another
    process); the child drops iterator and loader, collects garbage and
    exits. The parent then gets every remaining batch, right.

    (The child's exit hook is where the fork start method differs: workers
    started by multiprocessing's fork context are multiprocessing children
    that the hook would terminate.)"""
    before = procutil.descendants()
    loader = conveyor.DataLoader(Squares(12), batch_size=2, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    assert next(it).tolist() == squares([0, 1])
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # ---- the child: always ends in os._exit, never returns into pytest
        status = 1
        try:
            os.close(read_end)
            report = {"next": _next_in_child(it)}
            del it, loader
            gc.collect()
            # What interpreter exit runs (atexit): it terminates the daemonic
            # multiprocessing children it knows of; fork-started workers would
            # be among them had the engine not made the child forget them.
            multiprocessing.util._exit_function()
            os.write(write_end, json.dumps(report).encode())
            sys.exit(0)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + WAIT_CAP_S
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child did not finish")
        time.sleep(0.01)
    with os.fdopen(read_end, "rb") as f:
        report = json.loads(f.read() or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0
    assert "belongs to process" in report.get("next", ""), report
    assert f"process {os.getpid()}" in report["next"]

    rest = [b.tolist() for b in it]
    assert rest == [squares([k, k + 1]) for k in range(2, 12, 2)]
    del it, loader
    assert_no_worker_left(before)


# ============================================================= 11. user errors
class Faulty:
    """Map-style: sample i is i; some samples raise (see FAULTS)."""

    def __init__(self, n: int, faults: dict):
        self.n, self.faults = n, faults

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        kind = self.faults.get(i)
        if kind == "BoundaryError":
            raise BoundaryError(f"sample {i} is broken")
        if kind == "UnprintableError":
            raise UnprintableError(i)
        if kind == "LockedError":
            err = LockedError(f"sample {i} holds a lock")
            err.lock = threading.Lock()
            raise err
        return i


def collate_fails_on_8(samples):
    if 8 in samples:
        raise BoundaryError("collate_fn cannot take sample 8")
    return samples


@pytest.mark.parametrize("method", METHODS)
def test_user_errors_in_getitem_and_collate_keep_type_context_and_traceback(tmp_path, method):
    """Per batch: __getitem__ raising the user's class, one whose __str__
    raises (arrives as RuntimeError naming it), one that cannot be pickled
    (holds a lock: its class and traceback arrive), and collate_fn raising.
    Each names the worker, pid, batch and indices and carries the worker
    traceback; the other batches arrive in between, as in torch."""
    before = procutil.descendants()
    faults = {2: "BoundaryError", 4: "UnprintableError", 6: "LockedError"}
    loader = conveyor.DataLoader(
        Faulty(12, faults),
        batch_size=2,
        num_workers=2,
        collate_fn=collate_fails_on_8,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    seen = outcomes(iter(loader))
    pids = worker_pids(tmp_path, 2)
    assert [s for s in seen if not isinstance(s, BaseException)] == [[0, 1], [10, 11], "stop"]
    assert seen[0] == [0, 1] and seen[5] == [10, 11] and seen[6] == "stop"

    def check(err, batch, type_name, where):
        text = str(err)
        found = re.match(rf"Caught {type_name} in DataLoader worker process (\d)\.", text)
        assert found, text
        wid = int(found.group(1))
        assert (
            f"(conveyor: worker pid {pids[wid]}, batch {batch}, sample indices [{2 * batch}, {2 * batch + 1}])" in text
        )
        assert "Original Traceback" in text and f"in {where}" in text
        assert err.worker_id == wid and err.worker_pid == pids[wid]

    err = seen[1]
    assert type(err) is BoundaryError and "sample 2 is broken" in str(err)
    assert isinstance(err.__cause__, BoundaryError)  # the worker's own exception object
    check(err, 1, "BoundaryError", "__getitem__")

    err = seen[2]
    assert type(err) is RuntimeError and isinstance(err.__cause__, UnprintableError)
    check(err, 2, "UnprintableError", "__getitem__")

    err = seen[3]
    assert type(err) is LockedError and "sample 6 holds a lock" in str(err)
    check(err, 3, "LockedError", "__getitem__")

    err = seen[4]
    assert type(err) is BoundaryError and "collate_fn cannot take sample 8" in str(err)
    check(err, 4, "BoundaryError", "collate_fails_on_8")
    assert_no_worker_left(before)


class MissingFileForWorker0(conveyor.IterableDataset):
    """Worker 0's copy cannot open its file; worker 1's yields 100..105."""

    def __init__(self, missing: str):
        self.missing = missing

    def __iter__(self):
        info = conveyor.get_worker_info()
        if info.id == 0:
            open(self.missing)  # FileNotFoundError
        return iter(range(100, 106))


@pytest.mark.parametrize("method", METHODS)
def test_an_iterable_dataset_whose_iter_raises_fails_one_batch_then_counts_as_exhausted(tmp_path, method):
    """Worker 0's __iter__ raises FileNotFoundError: the batch it was asked
    for raises FileNotFoundError (type, traceback, worker); that copy then
    has no data, and worker 1's batches make up the rest of the epoch."""
    before = procutil.descendants()
    missing = str(tmp_path / "no-such-shard")
    loader = conveyor.DataLoader(
        MissingFileForWorker0(missing), batch_size=2, num_workers=2, multiprocessing_context=method
    )
    seen = outcomes(iter(loader))
    err = seen[0]
    assert type(err) is FileNotFoundError
    text = str(err)
    assert text.startswith("Caught FileNotFoundError in DataLoader worker process 0.")
    assert "batch 0" in text and "Original Traceback" in text and "in __iter__" in text and missing in text
    assert isinstance(err.__cause__, FileNotFoundError)
    assert seen[1:] == [[100, 101], [102, 103], [104, 105], "stop"]
    assert_no_worker_left(before)


class CorruptStateError(Exception):
    pass


class Resumable(conveyor.IterableDataset):
    """Each worker's copy yields wid*1000 + 0..n-1 and can say where it stands;
    with ``refuse`` its load_state_dict raises."""

    def __init__(self, n: int = 10, refuse: bool = False):
        self.n, self.refuse, self.start = n, refuse, 0

    def __iter__(self):
        wid = conveyor.get_worker_info().id
        for i in range(self.start, self.n):
            self.start = i + 1
            yield wid * 1000 + i

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        if self.refuse:
            raise CorruptStateError(f"cannot restore position {state['start']}")
        self.start = state["start"]


@pytest.mark.parametrize("method", METHODS)
def test_load_state_dict_raising_in_a_worker_on_resume_reaches_the_user(method):
    """A loader state saved mid-epoch with 2 workers is loaded into a new
    loader whose dataset's load_state_dict raises in the worker: the user
    gets CorruptStateError with the worker traceback, and the epoch ends
    (each copy that could not be restored has no data) instead of hanging."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(Resumable(), batch_size=2, num_workers=2, seed=0, multiprocessing_context=method)
    it = iter(loader)
    assert [next(it).tolist() for _ in range(3)] == [[0, 1], [1000, 1001], [2, 3]]
    state = loader.state_dict()
    del it
    resumed = conveyor.DataLoader(
        Resumable(refuse=True), batch_size=2, num_workers=2, seed=0, multiprocessing_context=method
    )
    resumed.load_state_dict(state)
    seen = outcomes(iter(resumed))
    # Batch 3 was worker 1's turn (it stood at its 3rd item), batch 4 worker 0's (at its 5th).
    assert len(seen) == 3 and seen[-1] == "stop", seen
    for err, batch, wid, position in ((seen[0], 3, 1, 2), (seen[1], 4, 0, 4)):
        assert type(err) is CorruptStateError
        text = str(err)
        assert text.startswith(
            f"Caught CorruptStateError in DataLoader worker process {wid}. (conveyor: worker pid "
        ), text
        assert f", batch {batch}, " in text
        assert (
            "Original Traceback" in text
            and "in load_state_dict" in text
            and f"cannot restore position {position}" in text
        )
        assert isinstance(err.__cause__, CorruptStateError)
    assert_no_worker_left(before)


class EndsWorkerAt1(Squares):
    """Sample 1 raises SystemExit(7) or KeyboardInterrupt."""

    def __init__(self, n: int, kind: str):
        super().__init__(n)
        self.kind = kind

    def __getitem__(self, i):
        if i == 1:
            raise SystemExit(7) if self.kind == "SystemExit" else KeyboardInterrupt()
        return i * i


def end_in_worker_init(kind: str, worker_id: int) -> None:
    raise SystemExit(7) if kind == "SystemExit" else KeyboardInterrupt()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("place", ["__getitem__", "worker_init_fn"])
@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
def test_systemexit_and_keyboardinterrupt_in_user_code_end_the_worker_with_a_clear_error(method, place, kind):
    """SystemExit(7) / KeyboardInterrupt raised in __getitem__ or in
    worker_init_fn: WorkerDiedError saying the exit code (7; 130 for
    KeyboardInterrupt), naming the exception, what the worker was doing and
    its traceback; never "exited with code 0". The loader is broken."""
    before = procutil.descendants()
    code = 7 if kind == "SystemExit" else 130
    if place == "__getitem__":
        loader = conveyor.DataLoader(
            EndsWorkerAt1(4, kind), batch_size=1, num_workers=1, multiprocessing_context=method
        )
        doing = "while loading batch 1 (sample indices [1])"
    else:
        loader = conveyor.DataLoader(
            Squares(4),
            batch_size=1,
            num_workers=1,
            multiprocessing_context=method,
            worker_init_fn=functools.partial(end_in_worker_init, kind),
        )
        doing = "while starting"
    it = iter(loader)
    delivered, err = take_until_error(it, WorkerDiedError)
    # Whether batch 0 comes first depends on whether next() had returned it
    # before the worker's end was read (as in torch, which raises from its
    # SIGCHLD handler the moment a worker dies): either is right.
    allowed = ([[0]], []) if place == "__getitem__" else ([],)
    assert [b.tolist() for b in delivered] in allowed
    text = str(err)
    found = re.match(
        rf"DataLoader worker \(pid\(s\) (\d+)\) exited unexpectedly with exit code {code}: {kind} was raised", text
    )
    assert found, text
    assert doing in text and "(conveyor: worker 0)" in text
    assert "Original Traceback" in text and f"in {place if place == '__getitem__' else 'end_in_worker_init'}" in text
    assert err.exit_code == code
    assert type(err.__cause__).__name__ == kind
    assert_no_worker_left(before)
    assert_raises_same_again(it, err)
    del it, loader, err
    assert_no_worker_left(before)


def fail_in_worker_init(worker_id: int) -> None:
    raise BoundaryError(f"worker {worker_id} cannot set up")


@pytest.fixture
def cpu_load():
    """Two busy loops beside the test (this machine has 2 cores), killed after it."""
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()


@pytest.mark.serial  # (two busy loops for two cores: the load it means, not another test's beside)
@pytest.mark.parametrize("method", METHODS)
def test_a_failing_worker_init_fn_is_reported_as_itself_even_under_cpu_load(cpu_load, method):
    """worker_init_fn raises in every worker, with two busy loops competing
    for the CPUs: each time, the user gets BoundaryError "while starting
    worker W" with the traceback, never a report of a dead worker (which a
    worker exiting right after its message used to give under load)."""
    before = procutil.descendants()
    # A spawn worker's start costs ~1 s of this loaded machine: fewer of them.
    repeats, workers = (10, 2) if method == "fork" else (4, 1)
    for _ in range(repeats):
        loader = conveyor.DataLoader(
            Squares(8),
            batch_size=2,
            num_workers=workers,
            multiprocessing_context=method,
            worker_init_fn=fail_in_worker_init,
        )
        it = iter(loader)
        with pytest.raises(BoundaryError) as caught:
            next(it)
        text = str(caught.value)
        assert re.match(
            r"Caught BoundaryError in DataLoader worker process (\d)\. \(conveyor: while starting worker \1, pid \d+\)",
            text,
        ), text
        assert "Original Traceback" in text and "in fail_in_worker_init" in text and "cannot set up" in text
        assert_raises_same_again(it, caught.value)
        del it, loader, caught
        assert_no_worker_left(before)


# ======================================================== 12. stall watchdog
@pytest.mark.parametrize("method", METHODS)
def test_a_stalled_sample_gives_one_stall_warning_with_the_workers_stack(tmp_path, method):
    """stall_warning=0.5 and sample 1 takes 1.5 s: exactly one StallWarning,
    naming worker 0, its pid, batch 1, sample index 1, and the worker's stack
    (inside SlowAt1.__getitem__); then every batch arrives. Worker start-up
    is kept out of the window (the test waits for worker_init_fn first)."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(
        SlowAt1(4, 1.5),
        batch_size=1,
        num_workers=1,
        stall_warning=0.5,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    it = iter(loader)
    pid = worker_pids(tmp_path, 1)[0]
    with pytest.warns(StallWarning) as record:
        got = [b.tolist() for b in it]  # (the line the warning points at)
    assert got == [[0], [1], [2], [3]]
    stalls = [w for w in record if issubclass(w.category, StallWarning)]
    assert len(stalls) == 1, [str(w.message) for w in stalls]
    assert (stalls[0].filename, linecache.getline(stalls[0].filename, stalls[0].lineno).strip()) == (
        __file__,
        "got = [b.tolist() for b in it]  # (the line the warning points at)",
    )
    text = str(stalls[0].message)
    assert f"worker 0 (pid {pid}) has been loading batch 1 (sample indices [1])" in text
    assert "stall_warning=0.5" in text
    stack = text.split("Its stack:", 1)[1]
    assert "__getitem__" in stack and "toy_datasets.py" in stack
    del it, loader
    assert_no_worker_left(before)


@pytest.mark.parametrize("method", METHODS)
def test_stall_warning_zero_never_warns(tmp_path, method):
    """stall_warning=0 turns the watchdog off: a sample that takes 1 s gives
    no StallWarning."""
    before = procutil.descendants()
    loader = conveyor.DataLoader(
        SlowAt1(3, 1.0),
        batch_size=1,
        num_workers=1,
        stall_warning=0,
        multiprocessing_context=method,
        worker_init_fn=recorder(tmp_path),
    )
    it = iter(loader)
    worker_pids(tmp_path, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [b.tolist() for b in it]
    assert got == [[0], [1], [2]]
    assert not [w for w in caught if issubclass(w.category, StallWarning)]
    del it, loader
    assert_no_worker_left(before)


# ================================================ 13. a ready batch is not held back
class GatedAt1:
    """Sample 1 waits until the gate file exists (raises after a cap, so a
    broken engine fails the test instead of hanging it)."""

    def __init__(self, n: int, gate: str):
        self.n, self.gate = n, gate

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 1 and not _wait_for_file(self.gate):
            raise TimeoutError("the gate never opened")
        return i


@pytest.mark.parametrize("method", METHODS)
def test_a_ready_batch_is_delivered_while_the_next_is_still_loading(tmp_path, method):
    """One worker holds batches 0 and 1 (one frame of tasks); batch 1 waits
    for a file the test creates only after it has received batch 0. So batch
    0 arriving at all proves it was not held back behind batch 1."""
    before = procutil.descendants()
    gate = str(tmp_path / "gate")
    loader = conveyor.DataLoader(GatedAt1(4, gate), batch_size=1, num_workers=1, multiprocessing_context=method)
    it = iter(loader)
    assert next(it).tolist() == [0]
    _write(gate, "open")
    assert [b.tolist() for b in it] == [[1], [2], [3]]
    del it, loader
    assert_no_worker_left(before)


# ================================================================ 14. timeout=
class StuckAt1:
    """Sample 1 records its worker's pid, then blocks until the test is over
    (the loader kills the worker when it gives up)."""

    def __init__(self, n: int, log_dir: str):
        self.n, self.log_dir = n, log_dir

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 1:
            _write(os.path.join(self.log_dir, "stuck"), str(os.getpid()))
            _wait_for_file(os.path.join(self.log_dir, "test-over"), cap_s=120)
        return i


@pytest.mark.parametrize("method", METHODS)
def test_timeout_names_the_batch_the_loop_waits_for_and_the_worker_stuck_on_it(tmp_path, method):
    """Two workers, sample 1 never finishes, timeout=1 (start-up kept out of
    the window: the test waits for the workers' worker_init_fn before the
    first next(), except worker 1's under fork, which starts in that next(),
    a fork away: docs/differences.md): RuntimeError
    "DataLoader timed out after 1 seconds" saying it waits for batch 1
    (sample index 1) and which worker (pid) is stuck on it; the loader is
    then broken and its workers gone."""
    before = procutil.descendants()
    try:
        loader = conveyor.DataLoader(
            StuckAt1(8, str(tmp_path)),
            batch_size=1,
            num_workers=2,
            timeout=1,
            multiprocessing_context=method,
            worker_init_fn=recorder(tmp_path),
        )
        it = iter(loader)
        worker_pids(tmp_path, 1 if method == "fork" else 2)
        assert next(it).tolist() == [0]
        worker_pids(tmp_path, 2)
        with pytest.raises(RuntimeError) as caught:
            next(it)
        text = str(caught.value)
        assert text.startswith("DataLoader timed out after 1 seconds"), text
        assert "waiting for batch 1 (sample indices [1])" in text
        stuck = int(open(tmp_path / "stuck").read())
        assert f"(pid {stuck}) has been loading batch 1 (sample indices [1])" in text
        assert_no_worker_left(before)
        assert_raises_same_again(it, caught.value)
        del it, loader, caught
        assert_no_worker_left(before)
    finally:
        _write(str(tmp_path / "test-over"), "over")
