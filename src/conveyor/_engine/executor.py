"""Executors: who runs fetch + collate for each planned batch.

    loader iterator ──begin_epoch(plan)──▶ Executor ──next_batch()──▶ Delivered(index, data | error, copies, timings)
                                             │
      InProcessExecutor (here): loads each batch in the calling thread (num_workers=0)
      PoolExecutor (pool_executor.py):
                         dispatch ──Tasks──▶ workers: processes (pool.py) | threads (threads.py)
                         ──results──▶ collect ──▶ decode ──▶ ReorderBuffer ──▶ Delivered

Both take the same tasks (batch index, sample indices, seed) and give the
same batches, whatever the number of workers. A failure of one batch is
that batch's ``Delivered.error`` and iteration goes on, as in torch.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Optional, Protocol

import threading

from .cpu import ThreadClock
from .fetch import EmptyBatch, EndOfData, FetchSpec, StageClock, fetch_in_main, make_fetcher
from .messages import LoadTimes, pack_load_times, unpack_load_times


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of the plan: its position in the epoch, its indices, its
    seed, and how long the sampler took to draw it."""

    batch_index: int
    indices: Any
    seed: Optional[int]
    sampler_s: float = 0.0


class DeliveryTimes(NamedTuple):
    """The main process's part of a batch's timings (see Timings)."""

    #: Drawing the batch's indices from the sampler.
    sampler_s: float = 0.0
    #: The header unpickled, views made, tensors made.
    decode_s: float = 0.0
    #: Loaded and waiting in the main process for its turn and for the loop.
    queue_s: float = 0.0
    pin_s: float = 0.0
    #: When the main process had the batch (a perf_counter reading).
    arrived_at: float = 0.0
    #: Set on the first batch after the workers started: seconds from their
    #: start to the last one being ready (NaN on other batches).
    workers_ready_s: float = math.nan
    #: Which worker loaded it (-1: the main process) and its pid (0: the main process).
    worker_id: int = -1
    worker_pid: int = 0
    #: Shared-memory slots lent out (in flight or held by the user) on delivery.
    slots_in_use: int = 0


#: Packing and unpacking DeliveryTimes, as messages.py does LoadTimes.
_PACKED_DELIVERY = struct.Struct("<6d3q")
pack_delivery_times = _PACKED_DELIVERY.pack
unpack_delivery_times = _PACKED_DELIVERY.unpack


class Timings(NamedTuple):
    """Where one batch's time went, in seconds, as two packed parts: the
    loading thread's (``loading``: a packed LoadTimes, from the worker or
    the in-process executor) and the main process's (``delivery``: a packed
    DeliveryTimes). One is made and recorded per batch, so it is kept as
    bytes, which cost next to nothing to make, keep and add up in bulk
    (stats/recorder.py reads many at once with numpy); :meth:`fields`
    unpacks them all, by name.

    Times are ``time.perf_counter()`` readings, a clock every process of
    the machine shares on Linux, so a worker's spans line up with the main
    process's on one timeline."""

    loading: bytes
    delivery: bytes

    @classmethod
    def make(cls, **fields: Any) -> "Timings":
        """From fields by name (those of LoadTimes and DeliveryTimes; the rest 0)."""
        loading = LoadTimes(**{name: fields.pop(name, 0) for name in LoadTimes._fields})
        delivery = DeliveryTimes(**fields)
        return cls(pack_load_times(*loading), pack_delivery_times(*delivery))

    def fields(self) -> dict:
        """Every field by name."""
        return {
            **LoadTimes(*unpack_load_times(self.loading))._asdict(),
            **DeliveryTimes(*unpack_delivery_times(self.delivery))._asdict(),
        }

    def with_pin(self, pin_s: float) -> "Timings":
        values = DeliveryTimes(*unpack_delivery_times(self.delivery))._replace(pin_s=pin_s)
        return self._replace(delivery=pack_delivery_times(*values))




class Delivered(NamedTuple):
    """One batch as the executor hands it out: its index in the epoch, and
    its data or the exception loading it raised (which still counts as
    delivered, as in torch); a named tuple, as Timings. For an iterable dataset, ``copies`` is where
    each copy stood as of this batch (one per worker, or the one of
    ``num_workers=0``; a plain dict, see progress.py)."""

    index: int
    data: Any = None
    error: Optional[BaseException] = None
    copies: Optional[dict] = None
    #: Where the batch's time went (None when stats are off or it failed).
    timings: Optional[Timings] = None
    #: Samples left out of it (skip_bad_samples): skips.SkippedSample records.
    skipped: tuple = ()
    #: Every sample was left out: nothing to give the user for this index.
    empty: bool = False


class Executor(Protocol):
    """What the loader's iterator asks of an executor."""

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> Optional[dict]:
        """Start a pass over ``tasks`` (see PoolExecutor.begin_epoch); where
        an iterable dataset's copies stand as it starts (None: fresh copies
        of the dataset as it is, or a map-style dataset)."""

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
    ) -> Optional[dict]:
        """Start a pass. Batches come in plan order here, so ``first_index``
        and ``skip`` (see :meth:`PoolExecutor.begin_epoch`) change nothing.
        An iterable dataset's ``__iter__`` runs now, as in torch; its one
        copy continues from ``workers_resume`` (a one-worker progress) when
        given. Returns where that copy stands now: the copy is the user's
        dataset object itself, which the pass then moves on, so a state
        saved before the first batch needs its start."""
        self._tasks = tasks
        if not self._fetcher.spec.iterable:
            return None
        states = workers_resume["states"] if workers_resume is not None else [None]
        self._fetcher.restart(states[0])
        return self._copies()

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
        except EmptyBatch:
            return Delivered(task.batch_index, skipped=self._skipped(task), empty=True)
        except Exception as error:
            return Delivered(task.batch_index, error=error, copies=self._copies())
        timings = None if clock is None else _timings(task, clock, *self._cpu.end())
        return Delivered(task.batch_index, data, copies=self._copies(), timings=timings, skipped=self._skipped(task))

    def _skipped(self, task: PlannedBatch) -> tuple:
        return skipped_records(self._fetcher.skipped, task.batch_index, "the main process")

    def _start_clock(self) -> StageClock:
        """A clock for the batch, and the CPU figures from its start (read
        around each load: between batches this thread runs the training loop)."""
        if self._cpu is None or self._cpu.thread != threading.get_ident():
            self.close_clock()
            self._cpu = ThreadClock()
        clock = StageClock()
        self._cpu.begin(clock.started_at)
        return clock

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
        close = getattr(self._fetcher, "close", None)
        if close is not None:
            close()  # (the reading threads of reads_in_flight)


def skipped_records(raw: Any, batch_index: int, worker: str) -> tuple:
    """The SkippedSample records of a batch's skips, as the fetcher noted them."""
    if not raw:
        return ()
    from ..skips import SkippedSample

    return tuple(SkippedSample(index, batch_index, worker, error, tb) for index, error, tb in raw)


def _timings(task: PlannedBatch, clock: StageClock, cpu_s: float, cpu_wait_s: float) -> Timings:
    started_at, fetched_at, collated_at = clock.started_at, clock.fetched_at, clock.collated_at
    loading = pack_load_times(
        clock.samples, started_at, fetched_at - started_at, collated_at - fetched_at, 0.0, cpu_s, cpu_wait_s
    )
    return Timings(loading, pack_delivery_times(task.sampler_s, 0.0, 0.0, 0.0, collated_at, math.nan, -1, 0, 0))
