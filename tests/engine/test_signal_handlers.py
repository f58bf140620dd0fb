"""The user's signal handlers interrupt the main thread anywhere, inside conveyor too.

* A handler that saves ``loader.state_dict()`` (a scheduler's checkpoint
  signal) returns at once, never waits on a lock the interrupted code
  holds, and its state resumes to exactly the rest of the epoch.
* A handler that raises (Ctrl-C's KeyboardInterrupt, a timeout's alarm)
  leaves the iterator either going on with every batch once and in order,
  or saying it cannot go on; the exception is never stored and raised
  again; a new ``iter(loader)`` works, persistent workers too.

Signals come from a thread of the test, every few milliseconds (SIGUSR1:
pytest-timeout keeps SIGALRM), for each kind of worker.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from contextlib import contextmanager

import pytest

import conveyor
from busy_datasets import BusySamples

WORKERS = [
    pytest.param(dict(num_workers=0), id="inline"),
    pytest.param(dict(num_workers=2, multiprocessing_context="fork"), id="fork"),
    pytest.param(dict(num_workers=2, multiprocessing_context="spawn"), id="spawn"),
    pytest.param(dict(num_workers=2, worker_method="thread"), id="threads"),
]


@contextmanager
def signal_storm(handler, low_s: float = 0.002, high_s: float = 0.005):
    """SIGUSR1 to this process every ``low_s`` to ``high_s``, handled by ``handler``."""
    previous = signal.signal(signal.SIGUSR1, handler)
    stop = threading.Event()
    rng = random.Random(0)

    def send() -> None:
        while not stop.wait(rng.uniform(low_s, high_s)):
            os.kill(os.getpid(), signal.SIGUSR1)

    sender = threading.Thread(target=send, name="test-signal-storm")
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join()
        signal.signal(signal.SIGUSR1, previous)


def firsts(batch) -> list:
    return batch[:, 0].tolist()


def loader_of(workers: dict, **more) -> conveyor.DataLoader:
    return conveyor.DataLoader(BusySamples(160), batch_size=4, shuffle=True, **workers, **more)


# ------------------------------------------------------------- saving states


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", WORKERS)
def test_states_saved_by_a_signal_storm_resume_exactly(workers):
    loader = loader_of(workers)
    received = {"epoch": 0, "count": 0}
    states = []

    def save(signum, frame):
        states.append((received["epoch"], received["count"], loader.state_dict(), loader.stats()))

    def inside_epochs() -> list:
        return [(e, n, state) for e, n, state, _ in states if state["in_epoch"]]

    epochs: list = []
    with signal_storm(save):
        while len(epochs) < 3 or len(inside_epochs()) < 10:  # (however fast the machine runs the epochs)
            assert len(epochs) < 100, f"only {len(inside_epochs())} states were saved inside 100 epochs"
            received.update(epoch=len(epochs), count=0)
            batches = []
            for batch in loader:
                batches.append(firsts(batch))
                received["count"] += 1
            epochs.append(batches)
    inside = inside_epochs()
    for epoch, count, state in inside:
        assert state["epoch"] == epoch and state["position"] in (count, count + 1)
    for _, _, _, stats in states:
        assert 0 <= stats.batches <= len(epochs) * 40
    chosen = inside[:: max(1, len(inside) // 10)][:10]
    between = [(e, n, state) for e, n, state, _ in states if not state["in_epoch"] and state["epoch"] < len(epochs)][:2]
    for epoch, count, state in chosen + between:
        resumed = loader_of(dict(num_workers=0))
        resumed.load_state_dict(state)
        rest = [firsts(batch) for batch in resumed]
        if state["in_epoch"]:
            assert rest == epochs[epoch][state["position"] :]
        else:  # (between epochs: the next epoch as it was)
            assert rest == epochs[state["epoch"]]


class SignalsWhileDrawing(conveyor.Sampler):
    """A batch sampler whose first draw of each pass sends SIGUSR1
    and goes on only once the handler has begun: a checkpoint signal that
    arrives while the epoch's first batch is being drawn."""

    def __init__(self, n: int, batch_size: int, handled: threading.Event):
        self.n, self.batch_size, self.handled = n, batch_size, handled

    def __len__(self) -> int:
        return self.n // self.batch_size

    def __iter__(self):
        self.handled.clear()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert self.handled.wait(30), "the signal's handler did not run"
        order = list(range(self.n))[::-1]
        for start in range(0, self.n, self.batch_size):
            yield order[start : start + self.batch_size]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", WORKERS[:2])
def test_a_handler_that_saves_while_a_save_draws_the_first_batch_returns(workers):
    # The user saves a state before the first batch (the first batch is drawn then, in the save), and a signal
    # whose handler saves too arrives during that draw: neither save waits on the other.
    handled = threading.Event()
    loader = conveyor.DataLoader(BusySamples(16), batch_sampler=SignalsWhileDrawing(16, 4, handled), **workers)
    saved = []

    def save(signum, frame):
        handled.set()
        saved.append(loader.state_dict())

    previous = signal.signal(signal.SIGUSR1, save)
    try:
        iterator = iter(loader)
        state = loader.state_dict()
        batches = [firsts(batch) for batch in iterator]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert saved == [state] and state["position"] == 0
    resumed = conveyor.DataLoader(BusySamples(16), batch_sampler=SignalsWhileDrawing(16, 4, handled))
    resumed.load_state_dict(state)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.set())
    try:
        assert [firsts(batch) for batch in resumed] == batches
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---------------------------------------------------------- raising handlers


class Tick(Exception):
    """What the test's handler raises (a timeout decorator's own exception, say)."""


def _in_conveyor(frame) -> bool:
    return frame is not None and os.sep + "conveyor" + os.sep in frame.f_code.co_filename


INTERRUPTED = WORKERS[:2] + [
    pytest.param(dict(num_workers=2, multiprocessing_context="fork", persistent_workers=True), id="fork-persistent"),
    pytest.param(dict(num_workers=2, multiprocessing_context="spawn", persistent_workers=True), id="spawn-persistent"),
    WORKERS[3],
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("raised", [Tick, KeyboardInterrupt])
@pytest.mark.parametrize("workers", INTERRUPTED)
def test_an_exception_raised_into_next_never_loses_repeats_or_hangs(workers, raised):
    loader = loader_of(workers, seed=3)
    reference = loader_of(dict(num_workers=0), seed=3)
    armed = {"on": False, "count": 0}

    def interrupt(signum, frame):
        if armed["on"] and _in_conveyor(frame):  # (once per next(), inside conveyor's own code)
            armed["on"] = False
            armed["count"] += 1
            raise raised(armed["count"])

    caught, stopped = set(), 0
    with signal_storm(interrupt, 0.001, 0.004):
        for epoch in range(100):
            if epoch >= 3 and armed["count"] >= 3:
                break  # (however fast the machine runs the epochs)
            expected = [firsts(batch) for batch in reference]
            iterator, got = iter(loader), []
            while True:
                armed["on"] = True
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                except raised as exc:
                    armed["on"] = False
                    assert exc.args[0] not in caught, "the same exception was raised again"
                    caught.add(exc.args[0])
                    continue
                except RuntimeError as exc:
                    armed["on"] = False
                    assert "cannot go on" in str(exc)
                    stopped += 1
                    with pytest.raises(RuntimeError, match="cannot go on"):
                        next(iterator)  # (and says so again)
                    state = loader.state_dict()
                    assert state["position"] == len(got)
                    resumed = loader_of(dict(num_workers=0), seed=3)
                    resumed.load_state_dict(state)
                    got += [firsts(batch) for batch in resumed]
                    break
                finally:
                    armed["on"] = False
                got.append(firsts(batch))
            assert got == expected
    # (one raised inside a finalizer the garbage collector ran, an earlier pass's, is Python's to print, not ours
    # to raise)
    assert armed["count"] >= 3 and 1 <= len(caught) <= armed["count"]
    assert [firsts(batch) for batch in loader] == [firsts(batch) for batch in reference]  # (and a new pass works)
