"""Executors: who runs fetch + collate for each planned batch.

    loader iterator ──begin_epoch(plan)──▶ Executor ──next_batch()──▶ Delivered(index, data | error, progress)
                                             │
      InProcessExecutor (here): loads each batch in the calling thread (num_workers=0)
      ProcessExecutor (process_executor.py):
                         dispatch ──Tasks (slot k)──▶ workers (pool.py) ──results──▶ collect
                         ──▶ views on slot k (SlotPool.decode) ──▶ ReorderBuffer ──▶ Delivered

Both take the same tasks (batch index, sample indices, seed) and give the
same batches, whatever the number of workers. A failure of one batch is
that batch's ``Delivered.error`` and iteration goes on, as in torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Optional, Protocol

import threading

from .cpu import ThreadClock
from .fetch import EndOfData, FetchSpec, StageClock, fetch_in_main, make_fetcher


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of the plan: its position in the epoch, its indices, its
    seed, and how long the sampler took to draw it."""

    batch_index: int
    indices: Any
    seed: Optional[int]
    sampler_s: float = 0.0


class Timings(NamedTuple):
    """Where one batch's time went, in seconds (a named tuple: one is made
    per batch, and a tuple is the cheapest record Python builds). Times
    are ``time.perf_counter()`` readings, a clock every process of the
    machine shares on Linux, so a worker's spans line up with the main
    process's on one timeline."""

    #: Samples in the batch.
    samples: int
    sampler_s: float
    fetch_s: float
    collate_s: float
    #: In the worker: arrays into shared memory, the header pickled.
    encode_s: float = 0.0
    #: In the main process: the header unpickled, views made, tensors made.
    decode_s: float = 0.0
    #: Loaded and waiting in the main process for its turn and for the loop.
    queue_s: float = 0.0
    pin_s: float = 0.0
    #: CPU time the loading thread used for fetch, collate and encode, and
    #: the time it was ready to run but waited for a core; the rest of
    #: their sum it waited on something else (storage, network, a lock).
    cpu_s: float = 0.0
    cpu_wait_s: float = 0.0
    #: Which worker loaded it (None: the main process) and its pid.
    worker_id: Optional[int] = None
    worker_pid: Optional[int] = None
    #: When fetch began and when the main process had the batch.
    started_at: float = 0.0
    arrived_at: float = 0.0
    #: Shared-memory slots lent out (in flight or held by the user) on delivery.
    slots_in_use: int = 0
    #: Set on the first batch after the workers started: seconds from their
    #: start to the last one being ready.
    workers_ready_s: Optional[float] = None


@dataclass(frozen=True)
class Delivered:
    """One batch as the executor hands it out: its index in the epoch, and
    its data or the exception loading it raised (which still counts as
    delivered, as in torch). For an iterable dataset, ``copies`` is where
    each copy stood as of this batch (one per worker, or the one of
    ``num_workers=0``; a plain dict, see progress.py)."""

    index: int
    data: Any = None
    error: Optional[BaseException] = None
    copies: Optional[dict] = None
    #: Where the batch's time went (None when stats are off or it failed).
    timings: Optional[Timings] = None


class Executor(Protocol):
    """What the loader's iterator asks of an executor."""

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a pass over ``tasks`` (see ProcessExecutor.begin_epoch)."""

    def next_batch(self) -> Delivered:
        """The next batch; StopIteration at the end of the pass."""

    def shutdown(self) -> None:
        """Stop; safe to call twice."""


class InProcessExecutor:
    """Loads each batch in the caller's thread (``num_workers=0``)."""

    def __init__(self, spec: FetchSpec, timed: bool = True):
        self._fetcher = make_fetcher(spec)
        self._tasks: Iterator[PlannedBatch] = iter(())
        self._timed = timed
        self._cpu: Optional[ThreadClock] = None

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a pass. Batches come in plan order here, so ``first_index``
        and ``skip`` (see :meth:`ProcessExecutor.begin_epoch`) change nothing.
        An iterable dataset's ``__iter__`` runs now, as in torch; its one
        copy continues from ``workers_resume`` (a one-worker progress) when given."""
        self._tasks = tasks
        if self._fetcher.spec.iterable:
            states = workers_resume["states"] if workers_resume is not None else [None]
            self._fetcher.restart(states[0])

    def next_batch(self) -> Delivered:
        """The next batch; StopIteration at the end of the epoch (its
        ``value``: where an iterable dataset's copy stands, as with workers)."""
        try:
            task = next(self._tasks)
        except StopIteration:
            raise StopIteration(self._copies()) from None
        clock = self._start_clock() if self._timed else None
        try:
            data = fetch_in_main(self._fetcher, task.indices, task.seed, clock)
        except EndOfData:
            raise StopIteration(self._copies()) from None
        except Exception as error:
            return Delivered(task.batch_index, error=error, copies=self._copies())
        timings = None if clock is None else _timings(task, clock, *self._cpu.used())
        return Delivered(task.batch_index, data, copies=self._copies(), timings=timings)

    def _start_clock(self) -> StageClock:
        """A clock for the batch; the CPU figures from now on (read around
        each load: between batches this thread runs the training loop)."""
        if self._cpu is None or self._cpu.thread != threading.get_ident():
            self.close_clock()
            self._cpu = ThreadClock()
        self._cpu.used()
        return StageClock()

    def close_clock(self) -> None:
        if self._cpu is not None:
            self._cpu.close()
            self._cpu = None

    def _copies(self) -> Optional[dict]:
        """An iterable dataset: where its one copy stands, as a one-worker progress."""
        if not self._fetcher.spec.iterable:
            return None
        return {"states": [self._fetcher.state()], "retired": [], "next": 0}

    def shutdown(self) -> None:
        self._tasks = iter(())
        self.close_clock()


def _timings(task: PlannedBatch, clock: StageClock, cpu_s: float, cpu_wait_s: float) -> Timings:
    return Timings(
        clock.samples,
        task.sampler_s,
        clock.fetch_s,
        clock.collate_s,
        cpu_s=cpu_s,
        cpu_wait_s=cpu_wait_s,
        started_at=clock.started_at,
        arrived_at=clock.started_at + clock.fetch_s + clock.collate_s,
    )
