"""Loading one batch: the one function every kind of worker runs.

    Task(epoch, batch index, seed, indices, slot) ──▶ Serving.load ──▶ Batch | Exhausted | TaskFailed
        new epoch: an iterable copy starts (its __iter__, its state loaded)
        the batch's seed ──▶ the global generators (as the worker's Place says) and each sample's
        fetch (fetch.py) ──▶ collate into the slot's writer, or arrays of their own
        timings (StageClock, ThreadClock) ──▶ LoadTimes (packed only to cross a pipe: transport/messages.py)

Where a worker runs is its :class:`~.places.Place`, a strategy chosen once
(``WorkerConfig.place``, from the worker method): a process of its own
(worker processes and Ray actors), a thread of the training loop's process,
or inline in the loop's own thread. It sets the worker up, and says how each
batch is seeded, where its arrays go, how it is encoded and what a failure
becomes (places.py tells them apart); this module asks it and tests no place.

``SystemExit`` or ``KeyboardInterrupt`` in user code ends a process or a
thread worker (:class:`~.ending.Ending`, carrying the Fatal it sends); inline,
it is raised as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ..cpu import ThreadClock
from ..transport.messages import Batch, Exhausted, LoadTimes, Task, TaskFailed
from ..transport.pickling import pack_result
from ..transport.slots import SlotWriter, StopFlag
from ..transport.wire import pack
from .copies import CopyState
from .fetch import EndOfData, FetchSpec, StageClock, fetch_seeded
from .places import PROCESS, Place
from .reads import EmptyBatch


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
    #: Where it runs (places.py): what differs between a process, a thread and inline, decided once.
    place: Place = PROCESS
    #: Ask the kernel to kill the worker when its parent ends. Linux sends
    #: that signal when the *thread* that started the worker ends, so the
    #: pool asks only when that thread lives as long as the process (the
    #: main thread or conveyor's process starter: workers/starter.py; or
    #: the forkserver's one thread).
    die_with_parent: bool = False

    @property
    def where(self) -> str:
        """Where user code runs, in torch's words: "in DataLoader worker process 0"."""
        return self.place.where(self.worker_id)


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
        place=running.place,
        # (Linux kills a worker when the thread that started it ends: launch.py starts each from one that lives on)
        die_with_parent=method in ("fork", "spawn", "forkserver"),
    )


# ------------------------------------------------------------------ serving
class Serving:
    """Loads one task at a time into a result message, as its place says."""

    def __init__(self, config: WorkerConfig, fetcher: Any, flags: Optional[StopFlag] = None):
        self.config = config
        self.fetcher = fetcher
        #: Where it loads (chosen once, with the config).
        self._place = config.place
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
        encode_s = self._place.encode_s(collated_at)
        return LoadTimes(
            clock.samples, started_at, fetched_at - started_at, collated_at - fetched_at, encode_s, cpu_s, cpu_wait_s
        )

    def failed(self, task: Task, doing: str = "") -> TaskFailed:
        """The failure being handled now (call it in an except block) as the
        task's answer, ``doing`` saying where beyond the worker."""
        where = f"{self.config.where} {doing}" if doing else self.config.where
        return self._place.failed(self.config.worker_id, task, where)

    def load(self, task: Task, writer: Optional[SlotWriter] = None) -> Any:
        """The task's result message: Batch (its arrays in ``writer``'s slot
        when given, else numpy arrays of their own), Exhausted or TaskFailed.
        Raises Ending for SystemExit and KeyboardInterrupt in user code (inline:
        raises them as they are)."""
        return self._place.run_batch(self._load, task, writer)

    def _load(self, task: Task, writer: Optional[SlotWriter]) -> Any:
        config, fetcher, place, wid = self.config, self.fetcher, self._place, self.config.worker_id
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
            allocate = place.allocator(config.fetch, task, writer, self._flags)
            data = fetch_seeded(fetcher, task.indices, task.seed, allocate, clock, place.seeds_globals)
            data, used, size = place.encode(data, writer)
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
        except BaseException:
            failed = place.answer(wid, config.where, task)
            if failed is None:
                raise  # (inline: as it is; the loop's signal handler's stops the pass, iteration.py)
            return failed
        try:  # where an iterable's copy stands after the batch, for DataLoader.state_dict
            state = fetcher.state()
        except BaseException:
            failed = place.answer(wid, config.where, task, "in state_dict()")
            if failed is None:
                raise
            return failed
        return message if state is None else dataclasses.replace(message, worker_state=state)
