"""Where a worker loads its batches, as strategies chosen once: what differs
between a worker process, a worker thread and the inline worker, in one place.

                    PROCESS (InProcess)             THREAD (InThread)            INLINE (Inline)
    runs in         a process of its own: pool.py,  a thread of the loop's       the loop's own thread
                    a Ray actor (ray_worker.py)     process: threads.py          (num_workers=0): inline.py
    set-up          global generators seeded,       its own WorkerInfo (an       a fetcher
                    torch at one thread,            iterable: its own copy),
                    WorkerInfo, worker_init_fn      worker_init_fn
    each batch      seeds the global generators     leaves them alone            seeds them, puts them back
                    and sample_rng()                (sample_rng() only)          after the batch
    arrays          into the task's slot, else      arrays of their own          collate_fn's, as the user
                    arrays of their own                                          gets them
    a failure       its text (TaskFailed)           its text                     the user's exception itself
    SystemExit, KI  end the worker (Ending)         end the worker               raised as they are
    in errors       "worker pid 12"                 "worker thread 0"            "the main process"

``WorkerConfig.place`` holds the strategy (``place_for``: from the loader's
worker method); serving.py asks it instead of testing where it runs.
"""

from __future__ import annotations

import dataclasses
import sys
from time import perf_counter
from typing import Any, Callable, Optional

from ...collate.allocation import allocate_batch
from ...rng import (
    global_generator_states,
    last_global_seed,
    restore_global_generators,
    seed_global_generators,
    thread_sample_random,
)
from .. import info as _info
from ..errors import WorkerNames, capture_failure
from ..info import WorkerInfo
from ..interrupts import raised_by_handler
from ..torch_hook import when_torch_loads
from ..transport.encoding import encode
from ..transport.messages import Task, TaskFailed
from ..transport.slots import SlotWriter, StopFlag
from .ending import Ending, fatal_message
from .fetch import FetchSpec, make_fetcher
from .rows import RowPlacer, SlotAllocator

#: What a batch's loading is, for ``Place.run_batch``: (task, writer) -> its answer.
LoadBatch = Callable[[Task, Optional[SlotWriter]], Any]


class Place:
    """Where a worker loads (see the module docstring): one subclass per
    place; what two of them share is written here once."""

    #: How the main process's errors name these workers.
    names: WorkerNames
    #: Each batch's seed goes to ``random``, ``numpy.random`` and torch too.
    seeds_globals = True

    def where(self, worker_id: int) -> str:
        """Where user code runs, in torch's words: "in DataLoader worker process 0"."""
        raise NotImplementedError

    def set_up(self, config: Any) -> Any:
        """Set up worker ``config.worker_id`` (a serving.WorkerConfig) here; its fetcher."""
        raise NotImplementedError

    def run_batch(self, load: LoadBatch, task: Task, writer: Optional[SlotWriter]) -> Any:
        """``load(task, writer)``, with what this place does around a batch."""
        return load(task, writer)

    def allocator(self, spec: FetchSpec, task: Task, writer: Optional[SlotWriter], flags: Optional[StopFlag]) -> Any:
        """Where collate puts the batch's arrays (None: collate_fn makes them)."""
        return _allocator(spec, task, writer, flags)

    def encode(self, data: Any, writer: Optional[SlotWriter]) -> tuple[Any, int, int]:
        """(the batch as it is sent, bytes of the slot used, the slot's size):
        here, handed over as it is."""
        return data, 0, 0

    def encode_s(self, collated_at: float) -> float:
        """Seconds spent encoding the batch collated at ``collated_at``."""
        return perf_counter() - collated_at

    def failed(self, worker_id: int, task: Task, where: str) -> TaskFailed:
        """The failure being handled now (call it in an except block) as the
        task's answer, told as text ``where`` the worker was."""
        return TaskFailed(
            task.epoch_id, task.batch_index, worker_id, task.indices, capture_failure(worker_id, where), None
        )

    def answer(self, worker_id: int, where: str, task: Task, doing: str = "") -> Optional[TaskFailed]:
        """The exception being handled in user code (call it in an except
        block) as the task's answer, ``doing`` saying where beyond the worker;
        SystemExit and KeyboardInterrupt end the worker (raises Ending);
        None: the caller raises the exception as it is."""
        if isinstance(sys.exc_info()[1], (SystemExit, KeyboardInterrupt)):
            raise Ending(fatal_message(worker_id, where, "task", task)) from None
        return self.failed(worker_id, task, f"{where} {doing}" if doing else where)


class InProcess(Place):
    """A worker process of its own (the pool's, or a Ray actor)."""

    names = WorkerNames("process", "processes", "worker pid {pid}", "worker {id}, pid {pid}")

    def where(self, worker_id: int) -> str:
        return f"in DataLoader worker process {worker_id}"

    def set_up(self, config: Any) -> Any:
        """Seed the process's generators, answer get_worker_info, run worker_init_fn; the fetcher."""
        seed_global_generators(config.seed)
        _set_worker_info(config)
        if config.worker_init_fn is not None:
            config.worker_init_fn(config.worker_id)
        return make_fetcher(config.fetch, config.worker_id)

    def encode(self, data: Any, writer: Optional[SlotWriter]) -> tuple[Any, int, int]:
        """Into the task's slot when it has one (the arrays' bytes there, the rest to pickle)."""
        if writer is None:
            return data, 0, 0
        data, used = encode(data, writer)
        return data, used, writer.size


class InThread(Place):
    """A worker thread of the training loop's process."""

    names = WorkerNames("thread", "threads", "worker thread {id}", "worker thread {id}")
    #: The generators are the process's, the loop's: ``conveyor.sample_rng()`` gives each sample its own.
    seeds_globals = False

    def where(self, worker_id: int) -> str:
        return f"in DataLoader worker thread {worker_id}"

    def set_up(self, config: Any) -> Any:
        """As a worker process's set-up, minus what belongs to the whole
        process (the global generators, torch's thread count): this thread's
        WorkerInfo, ``worker_init_fn``, the fetcher; the dataset as its kind
        wants it for a thread (executor/kinds.py: an iterable's own shallow
        copy, as each worker process has its own; a map-style one shared)."""
        fetch = dataclasses.replace(config.fetch, dataset=config.fetch.kind.for_thread(config.fetch.dataset))
        info = WorkerInfo(
            config.worker_id, config.num_workers, config.seed, fetch.dataset, thread_sample_random(), "thread"
        )
        _info.set_thread_info(info)
        if config.worker_init_fn is not None:
            config.worker_init_fn(config.worker_id)
        return make_fetcher(fetch, config.worker_id)


class Inline(Place):
    """The inline worker: the loop's own thread, as torch's single-process loading."""

    names = WorkerNames("inline worker", "inline workers", "the main process", "the main process")

    def where(self, worker_id: int) -> str:
        return "in the main process"

    def set_up(self, config: Any) -> Any:
        """Nothing to set up but the fetcher (no WorkerInfo, no worker_init_fn)."""
        return make_fetcher(config.fetch, config.worker_id)

    def run_batch(self, load: LoadBatch, task: Task, writer: Optional[SlotWriter]) -> Any:
        """The batch under its seed, the loop's generators put back after it."""
        saved = global_generator_states()
        try:
            return load(task, writer)
        finally:
            restore_global_generators(saved)
            thread_sample_random().reset(None)  # (sample_rng() is the OS's again outside loading)

    def allocator(self, spec: FetchSpec, task: Task, writer: Optional[SlotWriter], flags: Optional[StopFlag]) -> Any:
        """None: collate_fn makes the batch as the user gets it, as torch's single-process loading does."""
        return None

    def encode_s(self, collated_at: float) -> float:
        return 0.0  # (the batch is handed over as it is: nothing is encoded)

    def failed(self, worker_id: int, task: Task, where: str) -> TaskFailed:
        """As elsewhere, and the user's exception itself, raised as it is (as torch raises it)."""
        failure = capture_failure(worker_id, where)
        return TaskFailed(task.epoch_id, task.batch_index, worker_id, task.indices, failure, sys.exc_info()[1])

    def answer(self, worker_id: int, where: str, task: Task, doing: str = "") -> Optional[TaskFailed]:
        """None for SystemExit, KeyboardInterrupt and what the loop's own
        signal handler raised (the pass stops: iteration.py); else the failure."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (SystemExit, KeyboardInterrupt)) or (exc is not None and raised_by_handler(exc)):
            return None
        return self.failed(worker_id, task, f"{where} {doing}" if doing else where)


PROCESS = InProcess()
THREAD = InThread()
INLINE = Inline()

#: Where the workers of each worker method run (any other, a process start method or "ray": processes).
_PLACES: dict[str, Place] = {"thread": THREAD, "inline": INLINE}


def place_for(method: str) -> Place:
    """The place of workers started by ``method`` (decided once, for the pass's plan)."""
    return _PLACES.get(method, PROCESS)


def _allocator(spec: FetchSpec, task: Task, writer: Optional[SlotWriter], flags: Optional[StopFlag] = None) -> Any:
    """Where collate puts arrays: conveyor's own collate writes numpy leaves
    straight into the slot (samples placed row by row when it can); the main
    process converts to torch if the user asked for tensors. None for a
    user's collate_fn."""
    if spec.collate_into is None:
        return None
    if writer is None:
        return allocate_batch
    if spec.auto_collation and spec.kind.places_rows:
        return RowPlacer(writer, len(task.indices), task.fill_threads, flags)
    return SlotAllocator(writer)


def _set_worker_info(config: Any) -> None:
    """Answer ``get_worker_info()`` in this worker process (conveyor's, and torch's once it loads)."""
    _info.current = WorkerInfo(
        config.worker_id, config.num_workers, config.seed, config.fetch.dataset, thread_sample_random()
    )

    def tell_torch(torch: Any) -> None:
        # One intra-op thread per worker, as torch's workers: N workers each
        # running every core's worth of threads only fight, and a thread pool
        # inherited through fork hangs on its first use (PyTorch issue 53565).
        # worker_init_fn runs after this and may choose otherwise.
        torch.set_num_threads(1)
        # Datasets written for torch ask torch.utils.data.get_worker_info()
        # to shard themselves; answer them too. Torch loaded late (inside
        # __getitem__) also gets the seed of the batch in hand.
        try:
            from torch.utils.data._utils import worker as torch_worker

            fields = dict(
                id=config.worker_id, num_workers=config.num_workers, seed=config.seed, dataset=config.fetch.dataset
            )
            current = _info.current
            try:
                torch_worker._worker_info = torch_worker.WorkerInfo(
                    **fields, rng=current.rng if current is not None else None
                )
            except TypeError:  # (a torch whose WorkerInfo has no rng field)
                torch_worker._worker_info = torch_worker.WorkerInfo(**fields)
        except Exception:  # an unusual torch build: conveyor's own answer still works
            pass
        if last_global_seed() is not None:
            torch.default_generator.manual_seed(last_global_seed())

    when_torch_loads(tell_torch)


__all__ = ["Place", "InProcess", "InThread", "Inline", "PROCESS", "THREAD", "INLINE", "LoadBatch", "place_for"]
