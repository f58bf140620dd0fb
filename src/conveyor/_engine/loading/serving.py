"""Loading one batch: the one function every kind of worker runs.

    Task(epoch, batch index, seed, indices, slot) ──▶ Serving.load ──▶ Batch | Exhausted | TaskFailed
        new epoch: an iterable copy starts (its __iter__, its state loaded)
        the batch's seed ──▶ the global generators (as the worker's Place says) and each sample's
        fetch (fetch.py) ──▶ collate into the slot's writer, or arrays of their own
        timings (StageClock, ThreadClock) ──▶ LoadTimes (packed only to cross a pipe: transport/messages.py)

Where a worker runs is its :class:`Place`, chosen once when the pool starts:

  * ``PROCESS`` (workers/pool.py, workers/process.py): the process is the worker's own; the
    global generators are seeded per batch; a failure travels as text.
  * ``THREAD`` (workers/threads.py): the process is the training loop's; the global
    generators are left alone (``conveyor.sample_rng()`` gives each sample
    its own); a failure travels as text, as from a process.
  * ``INLINE`` (workers/inline.py, ``num_workers=0``): the loop's own thread; the
    global generators are seeded for the batch and put back after it, and a
    failure is the user's own exception object, as torch raises it.

``SystemExit`` or ``KeyboardInterrupt`` in user code ends a process or a
thread worker (:class:`Ending`, carrying the Fatal it sends); inline, it is
raised as it is.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Optional, Union

from ...collate.allocation import allocate_batch
from ...rng import global_generator_states, restore_global_generators, thread_sample_random
from ..cpu import ThreadClock
from ..errors import capture_failure
from ..interrupts import raised_by_handler
from ..transport.encoding import encode
from ..transport.messages import Batch, Exhausted, Fatal, LoadTimes, Task, TaskFailed
from ..transport.pickling import pack_result
from ..transport.slots import SlotWriter, StopFlag
from ..transport.wire import pack
from .copies import CopyState
from .fetch import EndOfData, FetchSpec, StageClock, fetch_seeded
from .reads import EmptyBatch
from .rows import RowPlacer, SlotAllocator

#: The exit code of a worker interrupted by KeyboardInterrupt (as a shell reports SIGINT).
INTERRUPTED_EXIT_CODE = 128 + 2


class Place(enum.Enum):
    """Where a worker runs (see the module docstring)."""

    PROCESS = "process"
    THREAD = "thread"
    INLINE = "inline"


@dataclass(frozen=True)
class WorkerFds:
    """The shared descriptors a worker process inherits (None or empty: that feature is off)."""

    #: The shared stop flag.
    stop: Optional[int] = None
    #: Where faulthandler writes this worker's stack (stacks.StackFile).
    stack: Optional[int] = None
    #: The pool's shared-memory slots, by slot number.
    slots: tuple = ()

    def as_tuple(self) -> tuple:
        """Every descriptor, in a fixed order (see :meth:`from_tuple`)."""
        return (-1 if self.stop is None else self.stop, -1 if self.stack is None else self.stack, *self.slots)

    @classmethod
    def from_tuple(cls, fds: tuple) -> "WorkerFds":
        stop, stack, *slots = (int(fd) for fd in fds)
        return cls(None if stop < 0 else stop, None if stack < 0 else stack, tuple(slots))


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, in one object."""

    worker_id: int
    num_workers: int
    seed: int
    fetch: FetchSpec
    worker_init_fn: Optional[Callable[[int], None]]
    parent_pid: Optional[int]
    #: Descriptors of the main process a forked worker closes (its pipe ends).
    close_fds: tuple = ()
    fds: WorkerFds = WorkerFds()
    #: Time each batch's stages (for the loader's stats).
    timed: bool = True
    place: Place = Place.PROCESS
    #: Ask the kernel to kill the worker when its parent ends. Linux sends
    #: that signal when the *thread* that started the worker ends, so the
    #: pool asks only when that thread lives as long as the process (the
    #: main thread or conveyor's process starter: workers/starter.py; or
    #: the forkserver's one thread).
    die_with_parent: bool = False

    @property
    def where(self) -> str:
        """Where user code runs, in torch's words: "in DataLoader worker process 0"."""
        if self.place is Place.INLINE:
            return "in the main process"
        return f"in DataLoader worker {self.place.value} {self.worker_id}"


#: Where the workers of each start method run (any other: processes).
PLACES = {"thread": Place.THREAD, "inline": Place.INLINE}


def worker_config(
    loading: FetchSpec, running: Any, base_seed: int, owner_pid: int, worker_id: int, fds: WorkerFds, close_fds: tuple
) -> WorkerConfig:
    """Worker ``worker_id``'s config, for the executor's plan (``running``:
    executor.Running) and pass seed; ``owner_pid``: the main process."""
    method = running.method
    return WorkerConfig(
        worker_id=worker_id,
        num_workers=running.workers,
        seed=(base_seed + worker_id) & ((1 << 63) - 1),
        fetch=loading,
        worker_init_fn=running.worker_init_fn,
        parent_pid=owner_pid if method not in ("forkserver", "thread", "inline") else None,
        close_fds=close_fds,
        fds=fds,
        timed=running.timed,
        place=PLACES.get(method, Place.PROCESS),
        # (Linux kills a worker when the thread that started it ends: launch.py starts each from one that lives on)
        die_with_parent=method in ("fork", "spawn", "forkserver"),
    )


# ------------------------------------------------------------------ ending
def exit_code(exc: Optional[BaseException]) -> int:
    """The code a process ends with when ``exc`` goes uncaught, as Python's."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED_EXIT_CODE
    return 1


def fatal_message(wid: int, where: str, stage: str, task: Optional[Task] = None) -> Fatal:
    """The exception being handled, as the Fatal message the worker sends before it ends."""
    exc = sys.exc_info()[1]
    return Fatal(
        worker_id=wid,
        failure=capture_failure(wid, where),
        exit_code=exit_code(exc),
        stage=stage,
        epoch_id=task.epoch_id if task is not None else None,
        batch_index=task.batch_index if task is not None else None,
        indices=task.indices if task is not None else None,
    )


class Ending(Exception):
    """User code asked the worker to end (SystemExit, KeyboardInterrupt); carries the Fatal to send."""

    def __init__(self, fatal: Fatal):
        super().__init__(fatal.failure.exc_type_name)
        self.fatal = fatal


# ------------------------------------------------------------------ serving
class Serving:
    """Loads one task at a time into a result message."""

    def __init__(self, config: WorkerConfig, fetcher: Any, flags: Optional[StopFlag] = None):
        self.config = config
        self.fetcher = fetcher
        #: The pool's shared flags (a worker process with slots), where an
        #: epoch's first batch says that it fills with every core.
        self._flags = flags
        self._epoch_id: Optional[int] = None
        self._noted = False
        self._cpu = ThreadClock()

    def begin_epoch(self, epoch_id: int, restore: Optional[CopyState]) -> Optional[CopyState]:
        """Start epoch ``epoch_id`` now rather than at its first task (an
        inline worker: torch calls an iterable dataset's ``__iter__`` when
        the loader's is called); where its copy then stands (None: map-style)."""
        self._epoch_id = epoch_id
        self.fetcher.begin_epoch(restore)
        return self.fetcher.state()

    def serve(self, task: Task, writer: Optional[SlotWriter]) -> bytes:
        """The task's result, pickled (a worker process): a Batch (arrays in
        the slot when there is one), Exhausted, or TaskFailed. Raises Ending
        for SystemExit and KeyboardInterrupt in user code."""
        try:
            message = self.load(task, writer)
            if writer is not None and writer.full and not self._noted and isinstance(message, Batch):
                self._noted = True
                message = dataclasses.replace(message, note=writer.full)
            try:
                return pack_result(message)
            except Exception:  # e.g. a collate_fn's output that does not pickle
                return pack(self.failed(task, "while sending its result to the main process"))
        finally:
            if writer is not None:
                writer.end()

    def close(self) -> None:
        """Let go of the CPU clock and the fetcher's reading threads (a
        thread or inline worker ends; a process just exits)."""
        self._cpu.close()
        close = getattr(self.fetcher, "close", None)
        if close is not None:
            close()

    def _times(self, clock: StageClock) -> LoadTimes:
        """The batch's LoadTimes: its stages ended when ``clock`` says,
        and encoding now (the CPU figures are read first, inside the span)."""
        cpu_s, cpu_wait_s = self._cpu.end()
        started_at, fetched_at, collated_at = clock.started_at, clock.fetched_at, clock.collated_at
        # (inline, the batch is handed over as it is: nothing is encoded)
        encode_s = 0.0 if self.config.place is Place.INLINE else perf_counter() - collated_at
        return LoadTimes(
            clock.samples, started_at, fetched_at - started_at, collated_at - fetched_at, encode_s, cpu_s, cpu_wait_s
        )

    def failed(self, task: Task, doing: str = "") -> TaskFailed:
        """The failure being handled now (call it in an except block) as the
        task's answer, ``doing`` saying where beyond the worker."""
        wid = self.config.worker_id
        where = f"{self.config.where} {doing}" if doing else self.config.where
        live = sys.exc_info()[1] if self.config.place is Place.INLINE else None
        return TaskFailed(task.epoch_id, task.batch_index, wid, task.indices, capture_failure(wid, where), live)

    def load(self, task: Task, writer: Optional[SlotWriter] = None) -> Any:
        """The task's result message: Batch (its arrays in ``writer``'s slot
        when given, else numpy arrays of their own), Exhausted or TaskFailed.
        Raises Ending for SystemExit and KeyboardInterrupt in user code (inline:
        raises them as they are)."""
        if self.config.place is Place.INLINE:
            saved = global_generator_states()  # (the loop's: put back after the batch)
            try:
                return self._load(task, writer)
            finally:
                restore_global_generators(saved)
                thread_sample_random().reset(None)  # (sample_rng() is the OS's again outside loading)
        return self._load(task, writer)

    def _load(self, task: Task, writer: Optional[SlotWriter]) -> Any:
        config, fetcher, wid = self.config, self.fetcher, self.config.worker_id
        message: Union[Batch, Exhausted]
        try:
            if task.epoch_id != self._epoch_id:
                self._epoch_id = task.epoch_id
                fetcher.begin_epoch(
                    task.restore, task.dataset_epoch
                )  # an iterable's copy: set_epoch, __iter__, load_state_dict
            if writer is not None:
                writer.begin()
            clock = StageClock() if config.timed else None
            if clock is not None:
                self._cpu.begin(clock.started_at)
            allocate = None if config.place is Place.INLINE else _allocator(config.fetch, task, writer, self._flags)
            data = fetch_seeded(fetcher, task.indices, task.seed, allocate, clock, config.place is not Place.THREAD)
            used = size = 0
            if writer is not None:
                data, used = encode(data, writer)
                size = writer.size
            times = None
            if clock is not None:
                times = self._times(clock)
            message = Batch(task.epoch_id, task.batch_index, wid, data, used, size, times=times)
            if fetcher.skipped:
                message = dataclasses.replace(message, skipped=tuple(fetcher.skipped))
        except EmptyBatch:
            message = Batch(task.epoch_id, task.batch_index, wid, None, skipped=tuple(fetcher.skipped), empty=True)
        except EndOfData:
            message = Exhausted(task.epoch_id, task.batch_index, wid)
        except (SystemExit, KeyboardInterrupt):
            if config.place is Place.INLINE:
                raise
            raise Ending(fatal_message(wid, config.where, "task", task)) from None
        except BaseException as exc:
            if config.place is Place.INLINE and raised_by_handler(exc):
                raise  # (the loop's signal handler, not the dataset: the pass stops, iteration.py)
            return self.failed(task)
        try:  # where an iterable's copy stands after the batch, for DataLoader.state_dict
            state = fetcher.state()
        except (SystemExit, KeyboardInterrupt):
            if config.place is Place.INLINE:
                raise
            raise Ending(fatal_message(wid, config.where, "task", task)) from None
        except BaseException as exc:
            if config.place is Place.INLINE and raised_by_handler(exc):
                raise
            return self.failed(task, "in state_dict()")
        return message if state is None else dataclasses.replace(message, worker_state=state)


def _allocator(spec: FetchSpec, task: Task, writer: Optional[SlotWriter], flags: Optional[StopFlag] = None) -> Any:
    """Where collate puts arrays: conveyor's own collate writes numpy leaves
    straight into the slot (samples placed row by row when it can); the main
    process converts to torch if the user asked for tensors. None for a
    user's collate_fn (and inline, where collate_fn makes the batch as the
    user gets it, as torch's single-process loading does)."""
    if spec.collate_into is None:
        return None
    if writer is None:
        return allocate_batch
    if spec.auto_collation and spec.kind.places_rows:
        return RowPlacer(writer, len(task.indices), task.fill_threads, flags)
    return SlotAllocator(writer)
