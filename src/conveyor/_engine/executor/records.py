"""What the loader's iterator and the executor exchange: the tasks of the
pass's plan, the delivered batches and their timings, and the executor's
protocol.

    loader iterator ──begin_epoch(plan: Tasks)──▶ Executor ──next_batch()──▶ Delivered(batch_index,
                                                                               data | error, copies, timings)

A batch crosses three records: what to load (``transport.messages.Task``),
what came back (``Batch``, ``TaskFailed`` or ``Exhausted``) and what is
delivered (:class:`Delivered`, which also waits in the reorder buffer for
its turn). The one executor (``executor/core.py``) runs every batch
through one ``Workers`` implementation (``workers/choice.py``): inline
(``num_workers=0``, ``workers/inline.py``), worker processes
(``workers/pool.py``), worker threads (``workers/threads.py``) or Ray actors
(``workers/ray_actors.py``). The same tasks (batch index, sample
indices, seed) give the same batches whatever the workers. A failure of one
batch is that batch's ``Delivered.error`` and iteration goes on, as in torch.
"""

from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Iterator, NamedTuple, Optional, Protocol

from ..loading.copies import Copies
from ..loading.places import Place, place_for
from ..transport.messages import LoadTimes, Task

#: How often ``next_batch`` looks, while it waits, for its ``until`` event
#: and for a shutdown from another thread.
INTERRUPT_CHECK_S = 0.05
#: How long a shutdown from another thread waits for the one inside
#: ``next_batch`` to leave before it stops the workers anyway.
SHUTDOWN_WAIT_S = 5.0


class Interrupted(Exception):
    """``next_batch`` was called off by its ``until`` event: the thread that
    drives the executor (the pin thread) is asked to stop, so that another
    can shut the executor down, or a later pass take it over, with no
    other caller inside."""


class Lifecycle(enum.Enum):
    """An executor's life: started, broken (one failure, raised again by
    every later call), closed (shut down)."""

    NEW = "new"
    RUNNING = "running"
    BROKEN = "broken"
    CLOSED = "closed"


@dataclass(frozen=True)
class Running:
    """How the executor runs the workers (the plan's ``running`` part)."""

    #: Workers to start: 1 inline worker for num_workers=0.
    workers: int
    #: The loader's num_workers as the user gave it.
    num_workers: int
    #: "inline" (num_workers=0), "thread", "ray", or "fork" / "spawn" / "forkserver".
    method: str
    #: Batches in flight per worker (1 inline: nothing is loaded ahead).
    prefetch_factor: int
    #: prefetch_factor was left to conveyor: keep SMALL_BATCH_WINDOW batches
    #: per worker in flight while batches are small.
    deepen_small: bool
    in_order: bool
    #: As the user gave it (torch's message repeats it verbatim); 0 inline.
    timeout_s: float
    worker_init_fn: Optional[Callable[[int], None]]
    #: Warn when nothing has arrived for this long while waiting (0: never).
    stall_warning_s: float
    #: Time each batch's stages (Delivered.timings).
    timed: bool
    #: The loader keeps its workers between passes.
    persistent: bool
    #: method "ray": what each worker's actor asks the cluster for (conveyor.RayWorkers).
    ray: Optional[Any] = None
    #: Fork worker 0 alone at the start and the others once the first task
    #: is out (workers/fleet.py), from the caller's thread (with a pin
    #: thread: PoolExecutor.send_first): under fork, with more than one worker.
    stagger: bool = False

    @property
    def place(self) -> Place:
        """Where the workers load (loading/places.py), as ``method`` decides it."""
        return place_for(self.method)


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


class Timings(NamedTuple):
    """Where one batch's time went, in seconds, in two parts: the loading
    thread's (``loading``, as its worker measured it) and the main
    process's (``delivery``). Both are plain named tuples: the LoadTimes
    were packed only to cross a pipe (``Batch.__reduce__``), and the stats
    recorder reads many at once into numpy columns (stats/recorder.py);
    :meth:`fields` gives them all by name. The executor makes it as the
    batch arrives (:meth:`on_arrival`) and completes it as the batch is
    delivered (:meth:`on_delivery`).

    Times are ``time.perf_counter()`` readings, a clock every process of
    the machine shares on Linux, so a worker's spans line up with the main
    process's on one timeline."""

    loading: LoadTimes
    delivery: DeliveryTimes

    @classmethod
    def make(cls, **fields: Any) -> "Timings":
        """From fields by name (those of LoadTimes and DeliveryTimes; the rest 0)."""
        loading = LoadTimes(**{name: fields.pop(name, 0) for name in LoadTimes._fields})
        return cls(loading, DeliveryTimes(**fields))

    @classmethod
    def on_arrival(
        cls, loading: LoadTimes, sampler_s: float, decode_s: float, arrived_at: float, worker_ids: tuple[int, int]
    ) -> "Timings":
        """A batch's timings as the main process has it in hand (``worker_ids``:
        WorkerView.timing_ids); what only its delivery knows is 0 until :meth:`on_delivery`."""
        return cls(loading, DeliveryTimes(sampler_s, decode_s, 0.0, 0.0, arrived_at, math.nan, *worker_ids, 0))

    def on_delivery(self, workers_ready_s: Optional[float], slots_in_use: int) -> "Timings":
        """Completed as the batch is delivered: how long it waited since it
        arrived, ``workers_ready_s`` (the first batch after the workers
        started; None on the others) and the slots lent out now."""
        main = self.delivery
        delivery = DeliveryTimes(
            main.sampler_s,
            main.decode_s,
            perf_counter() - main.arrived_at,
            main.pin_s,
            main.arrived_at,
            math.nan if workers_ready_s is None else workers_ready_s,
            main.worker_id,
            main.worker_pid,
            slots_in_use,
        )
        return Timings(self.loading, delivery)

    def fields(self) -> dict:
        """Every field by name."""
        return {**self.loading._asdict(), **self.delivery._asdict()}

    def with_pin(self, pin_s: float) -> "Timings":
        return Timings(self.loading, self.delivery._replace(pin_s=pin_s))


class Delivered(NamedTuple):
    """One batch as the executor hands it out: its index in the epoch, and
    its data or the exception loading it raised (which still counts as
    delivered, as in torch); a named tuple, as Timings. For an iterable
    dataset, ``copies`` is where each copy stood as of this batch (one per
    worker, or the one of ``num_workers=0``; a plain dict, see progress.py).
    The executor makes it as the batch arrives and holds it in its reorder
    buffer until its turn, then adds ``copies`` and completes ``timings``."""

    batch_index: int
    data: Any = None
    error: Optional[BaseException] = None
    copies: Optional[Copies] = None
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
        tasks: Iterator[Task],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[Copies] = None,
    ) -> Optional[Copies]:
        """Start a pass over ``tasks`` (the plan's, each booked by the
        executor as it sends it: see PoolExecutor.begin_epoch); where
        an iterable dataset's copies stand as it starts (None: fresh copies
        of the dataset as it is, or a map-style dataset)."""

    def send_first(self) -> None:
        """Send the first tasks (and start any worker left to start) from the
        caller's thread, before another thread drives next_batch."""

    def next_batch(self, until: Optional[threading.Event] = None) -> Delivered:
        """The next batch; StopIteration at the end of the pass; Interrupted
        once ``until`` is set (checked at least every ``INTERRUPT_CHECK_S``)."""

    def shutdown(self) -> None:
        """Stop; safe to call twice."""

    @property
    def usable(self) -> bool:
        """Whether it can run a pass: started, neither broken nor shut down."""


def skipped_records(raw: Any, batch_index: int, worker: str) -> tuple:
    """The SkippedSample records of a batch's skips, as the fetcher noted them."""
    if not raw:
        return ()
    from ...skips import SkippedSample

    return tuple(SkippedSample(index, batch_index, worker, error, tb) for index, error, tb in raw)
