"""pin_memory=True: with an accelerator, batches are pinned in a background
thread (inline without workers); without one, one warning and no pinning.

This machine has no GPU, so the accelerator is simulated: torch.accelerator
(and torch.cuda) report one, and Tensor.pin_memory records where it ran and
returns a copy.
"""

import os
import sys
import threading
import time
import warnings

import pytest
import torch
import torch.utils.data as tud

import conveyor.torch as ct
from conveyor._engine.executor.pin import PinThread
from conveyor._engine.executor.records import Interrupted
from conveyor._engine.workers import fleet

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake_accelerator(monkeypatch):
    calls = []

    def pin_memory(self, *args, **kwargs):
        calls.append(threading.current_thread().name)
        return self.clone()

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return calls


class Pairs:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": i}


def test_workers_batches_are_pinned_in_a_background_thread(fake_accelerator):
    loader = ct.DataLoader(Pairs(), batch_size=4, num_workers=2, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accelerator is there: no warning
        batches = list(loader)
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert len(fake_accelerator) == 2 * len(batches)  # every tensor of every batch
    assert set(fake_accelerator) == {"conveyor-pin-memory"}
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"], "the thread ends with the epoch"


def test_without_workers_batches_are_pinned_inline(fake_accelerator):
    batches = list(ct.DataLoader(Pairs(), batch_size=6, pin_memory=True))
    assert len(batches) == 2 and set(fake_accelerator) == {threading.current_thread().name}


def test_errors_cross_the_pin_thread_with_their_context(fake_accelerator):
    class Broken(Pairs):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("no sample 5")
            return super().__getitem__(i)

    it = iter(ct.DataLoader(Broken(), batch_size=4, num_workers=2, pin_memory=True))
    assert next(it)["y"].tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process"):
        next(it)
    assert next(it)["y"].tolist() == [8, 9, 10, 11]  # iteration goes on, as in torch


def test_abandoned_iterator_stops_the_pin_thread(fake_accelerator):
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=2, pin_memory=True)
    for _ in loader:
        break
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]


def _warnings_of_first_batch(module):
    loader = module.DataLoader(Pairs(), batch_size=4, pin_memory=True, pin_memory_device="cuda:1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        next(iter(loader))
    return [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


def test_pin_memory_device_is_deprecated_as_in_torch():
    """torch ignores pin_memory_device (the current accelerator is used) and
    says so; without an accelerator it also says nothing will be pinned."""
    ours, theirs = _warnings_of_first_batch(ct), _warnings_of_first_batch(tud)
    assert ours == theirs
    assert any("pin_memory_device is deprecated" in w for w in ours)


# --------------------------------------------- one thread inside the executor


def _fds_named(part):
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # (the listing's own descriptor, closed meanwhile)
            continue
        if part in target:
            found.append(target)
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method, passes", [("fork", 40), ("spawn", 3)])
def test_abandoned_iterators_stop_their_workers_with_the_pin_thread_out_of_the_executor(
    fake_accelerator, monkeypatch, method, passes
):
    """Leaving a pass early shuts its workers down while the pin thread may be
    sending them tasks: the pin thread must be out of the executor first
    (once, two threads wrote the same task pipe, and the stop failed half way,
    leaving processes and shared memory behind)."""
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: raised.append(repr(report.exc_value)))
    before = len(_fds_named("memfd:conveyor"))
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=2, pin_memory=True, multiprocessing_context=method)
    for _ in range(passes):
        for _ in loader:
            break
    assert raised == []
    assert len(_fds_named("memfd:conveyor")) == before
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]


class _Executor:
    """Stands for the executor: next_batch waits until called off, and
    records whether shutdown came while a thread was inside it."""

    def __init__(self, inside_hook=None):
        self.inside = threading.Event()
        self.shutdown_while_inside = None
        self.shutdown_thread = None
        self.inside_hook = inside_hook

    def next_batch(self, until):
        self.inside.set()
        try:
            if self.inside_hook is not None:
                self.inside_hook()
            while not until.wait(0.01):
                pass
            raise Interrupted
        finally:
            self.inside.clear()

    def shutdown(self):
        self.shutdown_while_inside = self.inside.is_set()
        self.shutdown_thread = threading.current_thread().name


def test_closing_calls_the_wait_off_and_shuts_down_only_once_the_thread_is_out():
    executor = _Executor()
    pin = PinThread(executor.next_batch, 2, pin=lambda batch: batch)
    assert executor.inside.wait(10)
    pin.close(then=executor.shutdown)
    assert executor.shutdown_while_inside is False
    assert executor.shutdown_thread == threading.current_thread().name
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]


def test_closing_from_the_pin_thread_itself_shuts_down_as_it_leaves_the_executor():
    """A finalizer may run in the pin thread (a garbage collection there)
    while it is inside the executor: the shutdown waits until it is out."""
    holder = {}
    made = threading.Event()

    def finalizer():
        assert made.wait(10)
        holder["pin"].close(then=executor.shutdown)

    executor = _Executor(inside_hook=finalizer)
    holder["pin"] = pin = PinThread(executor.next_batch, 2, pin=lambda batch: batch)
    made.set()
    with pytest.raises(RuntimeError, match="has been shut down"):
        pin.next_batch()
    assert executor.shutdown_while_inside is False
    assert executor.shutdown_thread == "conveyor-pin-memory"


def test_a_later_iter_takes_persistent_workers_over_from_the_pin_thread(fake_accelerator, monkeypatch):
    """Two pin threads must never drive the same persistent workers: the
    earlier pass's stops, and its next() says why."""
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: raised.append(repr(report.exc_value)))
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=2, pin_memory=True, persistent_workers=True)
    for _ in range(20):
        earlier = iter(loader)
        assert next(earlier)["y"].tolist() == [0, 1]
        later = iter(loader)
        assert [b["y"].tolist() for b in later] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
        with pytest.raises(RuntimeError, match="a later iter\\(loader\\) takes the workers over"):
            for _ in range(10):  # (batches it had pinned before the hand-over come first)
                next(earlier)
    assert raised == []
    assert len([t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]) == 0


class _Many:
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        return i


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method, attempts", [("fork", 25), ("spawn", 3)])
def test_a_shutdown_from_another_thread_waits_for_the_one_inside_the_executor(monkeypatch, method, attempts):
    """Whatever closes a pass (here its finalizer, as a garbage collection in
    another thread would run it) while a thread is busy inside the executor:
    that thread is told the pass was shut down, and the workers stop once it
    is out, with nothing left behind (once, both wrote the same task pipe)."""
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: raised.append(repr(report.exc_value)))
    before = len(_fds_named("memfd:conveyor"))
    for attempt in range(attempts):
        it = iter(ct.DataLoader(_Many(), batch_size=1, num_workers=2, multiprocessing_context=method))
        next(it)
        outcome = []

        def drive():
            try:
                while True:
                    next(it)
            except BaseException as exc:  # noqa: B036 (the test reads what ended the loop)
                outcome.append(exc)

        driver = threading.Thread(target=drive)
        driver.start()
        time.sleep(attempt * 0.004)  # (the close lands at a different step of the driver's each time)
        it._close()
        driver.join(30)
        assert not driver.is_alive()
        assert len(outcome) == 1 and "has been shut down" in str(outcome[0]), outcome
    assert raised == []
    assert len(_fds_named("memfd:conveyor")) == before


def test_under_fork_a_pinning_pass_forks_every_worker_from_the_callers_thread(fake_accelerator, monkeypatch):
    """Worker 0 starts in iter(), the others at the first next(), as without
    pin_memory, and every fork is made by the caller's thread, never by
    the pin thread (which would fork while the caller runs its own code)."""
    forked_by = []
    real = fleet.start_worker

    def start_worker(method, config, *args):
        forked_by.append((config.worker_id, threading.current_thread().name))
        return real(method, config, *args)

    monkeypatch.setattr(fleet, "start_worker", start_worker)
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=3, pin_memory=True, multiprocessing_context="fork")
    it = iter(loader)
    assert [wid for wid, _ in forked_by] == [0]
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]  # (not before the first next())
    assert next(it)["y"].tolist() == [0, 1]
    assert sorted(wid for wid, _ in forked_by) == [0, 1, 2]
    assert {name for _, name in forked_by} == {threading.current_thread().name}
    assert [b["y"].tolist() for b in it] == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert len(fake_accelerator) == 2 * 6 and set(fake_accelerator) == {"conveyor-pin-memory"}


def test_a_pinning_iterator_dropped_before_its_first_batch_leaves_nothing(fake_accelerator):
    before = len(_fds_named("memfd:conveyor"))
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=2, pin_memory=True, multiprocessing_context="fork")
    it = iter(loader)
    del it
    assert len(_fds_named("memfd:conveyor")) == before
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]
    assert [b["y"].tolist() for b in loader][0] == [0, 1]  # (and the loader starts again)
