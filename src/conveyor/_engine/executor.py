"""Executors: who runs fetch + collate for each planned batch.

    loader iterator ──begin_epoch(tasks)──▶ Executor ──next_batch()──▶ batch
                                             │
      InProcessExecutor: loads each batch in the calling thread (num_workers=0)
      ProcessExecutor:   dispatch ──Tasks (slot k)──▶ worker 0..N-1 ──Batch headers──▶ collect
                         ──▶ views on slot k (SlotPool.decode) ──▶ reorder ──▶ batch

Actors of the ProcessExecutor:
  * dispatch: keeps ``prefetch_factor × num_workers`` tasks in flight, each
    with a free shared-memory slot of its worker; a round's tasks for one
    worker travel in one write.
  * collect: one ``poll`` over every result pipe AND every worker's sentinel,
    so a dead worker is noticed the moment it dies; nothing is delivered
    before every worker said Ready (a failing ``worker_init_fn`` comes first).
  * reorder: in plan order (``in_order=True``) or as batches arrive.
  * one failure path (``_fail``) and one idempotent shutdown (``shutdown``).

Both executors take the same tasks (batch index, sample indices, seed) and
give the same batches, whatever the number of workers.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import itertools
import math
import os
import select
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Iterator, Optional

from .errors import WorkerDiedError, describe_exit, describe_indices, rebuild_exception
from .fetch import EndOfData, FetchSpec, fetch_in_main, make_fetcher
from .launch import Channels, WorkerProcess, deliver_config, pickle_config, start_worker
from .messages import Batch, Exhausted, InitFailed, Ready, Stop, Task, TaskFailed
from .pickling import check_picklable
from .shm import SPARE_SLOTS, SlotPool, StopFlag, torch_from_numpy
from .worker import WorkerConfig, _send, receive_all

#: After Stop, how long workers get to finish and exit before they are killed.
#: Short: workers hold nothing that needs a graceful end, and users wait on it.
_STOP_GRACE_S = 0.5
#: How long to wait for a killed worker to be reaped (the kernel is quick).
_REAP_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of the plan: its position in the epoch, its indices, its seed."""

    batch_index: int
    indices: Any
    seed: Optional[int]


class Lifecycle(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    BROKEN = "broken"
    CLOSED = "closed"


class InProcessExecutor:
    """Loads each batch in the caller's thread (``num_workers=0``)."""

    def __init__(self, spec: FetchSpec):
        self._fetcher = make_fetcher(spec)
        self._tasks: Iterator[PlannedBatch] = iter(())
        #: Batch index of the latest batch handed out (or raised); None when none was.
        self.last_delivered: Optional[int] = None

    #: Only workers' copies of an iterable dataset need this (see ProcessExecutor).
    worker_progress = None

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a pass. Batches come in plan order here, so ``first_index``
        and ``skip`` (see :meth:`ProcessExecutor.begin_epoch`) change nothing."""
        self._tasks = tasks
        if self._fetcher.spec.iterable:
            self._fetcher.restart()

    def next_batch(self) -> Any:
        self.last_delivered = None
        task = next(self._tasks)  # StopIteration ends the epoch
        self.last_delivered = task.batch_index
        try:
            return fetch_in_main(self._fetcher, task.indices, task.seed)
        except EndOfData:
            raise StopIteration from None

    def shutdown(self) -> None:
        self._tasks = iter(())


@dataclass
class _Worker:
    id: int
    process: WorkerProcess
    channels: Channels
    #: (epoch_id, batch_index, slot) of tasks sent and not yet answered, oldest first.
    outstanding: deque = field(default_factory=deque)
    #: False once its copy of an iterable dataset ran out this epoch.
    active: bool = True
    exited: bool = False


class _Poller:
    """One ``poll`` object over every live worker's result pipe and sentinel,
    kept from wait to wait: building a selector per wait, as
    ``multiprocessing.connection.wait`` does, costs more than a small batch."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._by_fd: dict[int, tuple[_Worker, bool]] = {}

    @property
    def watched(self) -> bool:
        return bool(self._by_fd)

    def watch(self, worker: _Worker) -> None:
        for fd, is_exit in ((worker.channels.results.fileno(), False), (_fileno(worker.process.sentinel), True)):
            self._poll.register(fd, select.POLLIN)
            self._by_fd[fd] = (worker, is_exit)

    def forget(self, worker: _Worker) -> None:
        for fd, (owner, _) in list(self._by_fd.items()):
            if owner is worker:
                self._poll.unregister(fd)
                del self._by_fd[fd]

    def wait(self, timeout_s: Optional[float]) -> list[tuple[_Worker, bool]]:
        """(worker, whether it exited) for each ready descriptor; [] at the timeout."""
        timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout_ms) if fd in self._by_fd]


def _fileno(handle: Any) -> int:
    return handle if isinstance(handle, int) else handle.fileno()


@dataclass(frozen=True)
class ProcessConfig:
    """How to run the pool; built by the DataLoader from its arguments."""

    spec: FetchSpec
    num_workers: int
    start_method: str
    prefetch_factor: int
    in_order: bool
    timeout_s: float  # as the user gave it (torch's message repeats it verbatim)
    worker_init_fn: Optional[Callable[[int], None]]
    base_seed: int


class ProcessExecutor:
    """Runs fetch + collate in worker processes.

    Keeps at most ``prefetch_factor × num_workers`` batches between dispatch
    and delivery; delivers in plan order (``in_order=True``) or as batches
    complete. A failure in user code is raised at that batch's turn and the
    pool carries on, as in torch; a dead worker breaks the pool, stops every
    worker and keeps raising the same error.
    """

    def __init__(self, config: ProcessConfig):
        self.config = config
        self.state = Lifecycle.NEW
        self._workers: list[_Worker] = []
        self._error: Optional[BaseException] = None
        self._epoch_id = -1
        self._tasks: Iterator[PlannedBatch] = iter(())
        self._plan_done = True
        self._pending: dict[int, PlannedBatch] = {}
        self._ready: dict[int, Any] = {}
        self._skipped: set[int] = set()
        self._arrivals: deque = deque()
        self._next_to_deliver = 0
        self._cycle = itertools.count()
        #: Batch index of the latest batch handed out (or raised); None when none was.
        self.last_delivered: Optional[int] = None
        #: Iterable datasets: where each worker's copy stood after its last
        #: delivered batch, which workers ran out, whose turn is next.
        self.worker_progress: Optional[dict] = None
        self._retired_at: dict[int, tuple] = {}
        self._restore: dict[int, Any] = {}
        self._slots: Optional[SlotPool] = None
        self._stop_flag: Optional[StopFlag] = None
        self._noted = False
        #: Workers that have not said Ready yet; nothing is delivered until none.
        self._starting: set[int] = set()
        self._poller = _Poller()

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Check that what travels can be pickled, then start every worker."""
        cfg = self.config
        method = cfg.start_method
        payload_by_worker: list[Optional[bytes]] = [None] * cfg.num_workers
        if method != "fork":
            check_picklable(
                {"dataset": cfg.spec.dataset, "collate_fn": cfg.spec.collate_fn, "worker_init_fn": cfg.worker_init_fn},
                method,
            )
        self._slots = self._make_slots()
        self._stop_flag = StopFlag() if self._slots is not None else None
        slot_fds = tuple(self._slots.fds) if self._slots else ()
        try:
            for wid in range(cfg.num_workers):
                channels = Channels()
                worker_config = WorkerConfig(
                    worker_id=wid,
                    num_workers=cfg.num_workers,
                    seed=(cfg.base_seed + wid) & ((1 << 63) - 1),
                    fetch=cfg.spec,
                    worker_init_fn=cfg.worker_init_fn,
                    parent_pid=os.getpid() if method != "forkserver" else None,
                    close_fds=self._main_fds() + channels.main_fds(),
                    slot_fds=slot_fds,
                    stop_fd=self._stop_flag.fd if self._stop_flag is not None else None,
                )
                if method != "fork":
                    payload_by_worker[wid] = pickle_config(worker_config)
                process = start_worker(method, worker_config, payload_by_worker[wid], channels)
                channels.close_worker_ends()
                self._workers.append(_Worker(wid, process, channels))
                self._poller.watch(self._workers[-1])
                self._starting.add(wid)
            for worker in self._workers:
                deliver_config(method, worker.channels, payload_by_worker[worker.id])
        except BaseException:
            self.shutdown()
            raise
        self.state = Lifecycle.RUNNING

    def _make_slots(self) -> Optional[SlotPool]:
        cfg = self.config
        try:
            return SlotPool(cfg.prefetch_factor * cfg.num_workers + SPARE_SLOTS)
        except OSError as exc:
            warnings.warn(
                f"conveyor: shared memory (memfd_create) is unavailable here ({exc}); batches travel "
                f"through pipes instead (same data, slower).",
                stacklevel=4,
            )
            return None

    def _main_fds(self) -> tuple:
        return tuple(fd for w in self._workers for fd in w.channels.main_fds())

    # ----------------------------------------------------------------- epoch
    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a new pass; results of an abandoned pass are dropped on arrival.

        A resumed epoch's plan starts at batch ``first_index`` and leaves out
        the batches in ``skip`` (delivered before the resume, with
        ``in_order=False``); in-order delivery starts at ``first_index`` and
        passes over ``skip``. For an iterable dataset, ``workers_resume`` (a
        saved ``worker_progress``) puts each worker's copy back where it
        stood, retires the workers that had run out and gives the next turn
        to the worker whose turn it was.
        """
        self._raise_if_unusable()
        self._epoch_id = epoch_id
        self._tasks = tasks
        self._plan_done = False
        self._pending.clear()
        self._ready.clear()
        self._skipped = set(skip)
        self._arrivals.clear()
        self._next_to_deliver = first_index
        self._cycle = itertools.count()  # round robin starts at worker 0, as torch's
        for worker in self._workers:
            worker.active = True
        self._retired_at.clear()
        self._restore = {}
        self.worker_progress = None
        if self.config.spec.iterable:
            count = len(self._workers)
            self.worker_progress = {"states": [None] * count, "retired": [], "next": 0}
            if workers_resume is not None:
                self._resume_workers(workers_resume)

    def _resume_workers(self, saved: dict) -> None:
        states, retired, turn = list(saved["states"]), list(saved["retired"]), int(saved["next"])
        self.worker_progress = {"states": states, "retired": retired, "next": turn}
        self._cycle = itertools.count(turn)
        self._restore = {wid: state for wid, state in enumerate(states) if state is not None}
        for wid in retired:
            self._workers[wid].active = False

    def next_batch(self) -> Any:
        """The next batch of this epoch; StopIteration at its end."""
        self.last_delivered = None
        self._raise_if_unusable()
        deadline = time.monotonic() + self.config.timeout_s if self.config.timeout_s > 0 else None
        try:
            while True:
                self._raise_if_unusable()  # shut down meanwhile (from another thread)
                found, item = self._take_ready()
                if found:
                    self.last_delivered = item.batch_index
                    return self._deliver(item)
                self._dispatch()
                if self._plan_done and not self._pending:
                    raise StopIteration
                self._wait(deadline)
        except KeyboardInterrupt:
            self.shutdown()
            raise

    # ------------------------------------------------------------- dispatch
    def _in_flight(self) -> int:
        return len(self._pending)

    def _dispatch(self) -> None:
        """Fill the window; the tasks of one round go to each worker in one write."""
        limit = self.config.prefetch_factor * self.config.num_workers
        batches: dict[int, list] = {}
        while not self._plan_done and self._in_flight() < limit:
            worker = self._choose_worker()
            if worker is None:
                if not any(w.active for w in self._workers):
                    self._plan_done = True
                break
            try:
                planned = next(self._tasks)
            except StopIteration:
                self._plan_done = True
                break
            batches.setdefault(worker.id, []).append(self._assign(worker, planned))
        for wid, tasks in batches.items():
            self._send_tasks(self._workers[wid], tasks)

    def _choose_worker(self) -> Optional[_Worker]:
        active = [w for w in self._workers if w.active and not w.exited]
        if not active:
            return None
        turn = next(self._cycle)
        if self.config.spec.iterable:
            # Round robin over all workers, skipping retired ones, as torch:
            # which worker serves a batch decides its content.
            count = len(self._workers)
            for step in range(count):
                worker = self._workers[(turn + step) % count]
                if worker.active and not worker.exited:
                    self._cycle = itertools.count(turn + step + 1)
                    return worker
        # Map-style: the least busy worker; content does not depend on it.
        return min(active, key=lambda w: (len(w.outstanding), (w.id - turn) % len(self._workers)))

    def _assign(self, worker: _Worker, planned: PlannedBatch) -> Task:
        """Book a task for ``worker`` (a slot, its place in the queues)."""
        slot = self._slots.lend() if self._slots is not None else None
        restore = self._restore.pop(worker.id, None)
        worker.outstanding.append((self._epoch_id, planned.batch_index, slot))
        self._pending[planned.batch_index] = planned
        return Task(self._epoch_id, planned.batch_index, planned.seed, planned.indices, slot, restore)

    def _send_tasks(self, worker: _Worker, tasks: list) -> None:
        try:
            _send(worker.channels.tasks, *tasks)
        except (BrokenPipeError, OSError):
            for task in tasks:  # it is dead: the sentinel tells how
                self._give_back(task.slot)
            self._on_worker_exit(worker)

    def _give_back(self, slot: Optional[int]) -> None:
        """Return a slot that a message did not fill, or whose batch is dropped."""
        if self._slots is not None:
            self._slots.give_back(slot)

    # ------------------------------------------------------------- collect
    def _wait(self, deadline: Optional[float]) -> None:
        """Wait for a result or a worker's exit (or the deadline), and take it in."""
        if not self._poller.watched:
            raise RuntimeError("every DataLoader worker has stopped; nothing is left to wait for")
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = self._poller.wait(timeout)
        if not ready:
            self._on_timeout()
        exited = []
        for worker, is_exit in ready:
            if is_exit:
                exited.append(worker)
            else:
                self._receive_one(worker)
        for worker in exited:
            self._drain(worker)
            self._on_worker_exit(worker)

    def _receive_one(self, worker: _Worker) -> None:
        """Take one write's messages; if more are waiting, the next poll says so at once."""
        try:
            messages = receive_all(worker.channels.results)
        except (EOFError, OSError):
            return  # the sentinel tells whether it died
        for message in messages:
            self._handle(worker, message)

    def _drain(self, worker: _Worker) -> None:
        """Take every message a worker sent before it exited."""
        conn = worker.channels.results
        try:
            while not conn.closed and conn.poll():
                for message in receive_all(conn):
                    self._handle(worker, message)
        except (EOFError, OSError):
            pass

    def _handle(self, worker: _Worker, message: Any) -> None:
        if isinstance(message, InitFailed):
            self._fail(rebuild_exception(message.failure, f"(conveyor: while starting worker {message.worker_id}, pid {worker.process.pid})"))
        if isinstance(message, Ready):
            self._starting.discard(message.worker_id)
            return
        slot = worker.outstanding.popleft()[2] if worker.outstanding else None
        if message.epoch_id != self._epoch_id or message.batch_index not in self._pending:
            self._give_back(slot)
            return  # a result of an abandoned epoch
        if isinstance(message, Batch):
            message = dataclasses.replace(message, data=self._decode(worker, slot, message))
        else:
            self._give_back(slot)
        if isinstance(message, Exhausted):
            worker.active = False
            self._pending.pop(message.batch_index)
            self._skipped.add(message.batch_index)
            self._retired_at[message.batch_index] = (message.worker_id, message.worker_state)
            self._arrivals.append(message.batch_index)
            return
        self._ready[message.batch_index] = message
        self._arrivals.append(message.batch_index)

    def _decode(self, worker: _Worker, slot: Optional[int], message: Batch) -> Any:
        """The batch as the user gets it: views on the slot, tensors if asked."""
        if message.note and not self._noted:
            self._noted = True
            warnings.warn(
                f"conveyor: {message.note}. Batches that do not fit travel through pipes instead (same "
                f"data, slower). Free memory, or lower batch_size, prefetch_factor or num_workers.",
                stacklevel=5,
            )
        if slot is None or message.used == 0:
            self._give_back(slot)
            data = message.data
        else:
            data = self._slots.decode(message.data, slot, message.slot_size, message.used, torch_from_numpy)
        if self.config.spec.to_torch:
            from ..collate import to_torch

            data = to_torch(data)
        return data

    def _take_ready(self) -> tuple[bool, Any]:
        if self._starting:
            return False, None
        if self.config.in_order:
            while self._next_to_deliver in self._skipped:
                self._skipped.discard(self._next_to_deliver)
                self._note_retired(self._retired_at.pop(self._next_to_deliver, None))
                self._next_to_deliver += 1
            index = self._next_to_deliver
            if index in self._ready:
                self._next_to_deliver += 1
                self._pending.pop(index, None)
                message = self._ready.pop(index)
                self._note_delivered(message)
                return True, message
            return False, None
        while self._arrivals:
            index = self._arrivals.popleft()
            if index in self._ready:
                self._pending.pop(index, None)
                return True, self._ready.pop(index)
        return False, None

    def _note_delivered(self, message: Any) -> None:
        progress = self.worker_progress
        if progress is None:
            return
        state = getattr(message, "worker_state", None)
        if state is not None:
            progress["states"][message.worker_id] = state
        progress["next"] = (message.worker_id + 1) % len(progress["states"])

    def _note_retired(self, retired: Optional[tuple]) -> None:
        progress = self.worker_progress
        if progress is None or retired is None:
            return
        wid, state = retired
        if state is not None:
            progress["states"][wid] = state
        if wid not in progress["retired"]:
            progress["retired"].append(wid)

    def _deliver(self, message: Any) -> Any:
        if isinstance(message, TaskFailed):
            context = (
                f"(conveyor: worker pid {message.failure.pid}, batch {message.batch_index}, "
                f"{describe_indices(message.indices)})"
            )
            err = rebuild_exception(message.failure, context)
            try:
                err.batch_index = message.batch_index
                err.indices = message.indices
            except AttributeError:
                pass
            raise err
        return message.data

    # ------------------------------------------------------------- failures
    def _busy_text(self) -> str:
        parts = []
        for w in self._workers:
            current = [b for e, b, _ in w.outstanding if e == self._epoch_id and b in self._pending]
            if current:
                planned = self._pending[current[0]]
                parts.append(
                    f"worker {w.id} (pid {w.process.pid}) on batch {current[0]} ({describe_indices(planned.indices)})"
                )
        return "; ".join(parts) if parts else "no worker had a batch in hand"

    def _on_timeout(self) -> None:
        # Terminal, unlike torch: something is stuck, and the workers are
        # stopped now rather than whenever the traceback lets the iterator go.
        self._fail(
            RuntimeError(
                f"DataLoader timed out after {self.config.timeout_s} seconds. (conveyor: still busy: "
                f"{self._busy_text()}. The workers were stopped; raise timeout=, or look for a slow "
                f"or stuck sample.)"
            )
        )

    def _on_worker_exit(self, worker: _Worker) -> None:
        worker.exited = True
        self._poller.forget(worker)
        worker.process.join(_REAP_TIMEOUT_S)
        if self.state is not Lifecycle.RUNNING:
            return
        current = [b for e, b, _ in worker.outstanding if e == self._epoch_id and b in self._pending]
        if current:
            doing = f"It was loading batch {current[0]} ({describe_indices(self._pending[current[0]].indices)})."
        else:
            doing = "It had no batch in hand."
        text = f"{describe_exit(worker.process.pid, worker.process.exitcode)} (conveyor: worker {worker.id}. {doing})"
        self._fail(WorkerDiedError(text))

    def _fail(self, error: BaseException) -> None:
        """The one failure path: remember, stop everything, raise; later
        calls raise the same error."""
        self._error = error
        self.state = Lifecycle.BROKEN
        self._stop_workers()
        raise self._fresh_error()

    @property
    def broken(self) -> bool:
        return self._error is not None

    def _fresh_error(self) -> BaseException:
        """A copy of the stored error to raise. The stored one is never raised
        itself: a traceback on it would hold the frames (iterator, loader)
        of the call that raised it, and the executor would keep them alive."""
        error = copy.copy(self._error)
        error.__cause__ = self._error.__cause__
        return error

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise self._fresh_error()
        if self.state is Lifecycle.CLOSED:
            raise RuntimeError("this DataLoader iterator has been shut down; start a new one with iter(loader)")

    # ------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop the pool. Safe to call twice, from a finalizer or at exit."""
        if self.state is not Lifecycle.BROKEN:
            self.state = Lifecycle.CLOSED
        self._stop_workers()

    def _stop_workers(self) -> None:
        """1. raise the shared stop flag (workers skip their queued tasks) and
        send Stop (non-blocking); 2. drain results and wait up to
        ``_STOP_GRACE_S``; 3. kill what is left and reap it; 4. close pipes,
        sentinels and shared memory (batches the user holds stay valid)."""
        workers, self._workers = self._workers, []
        if self._stop_flag is not None:
            self._stop_flag.set()  # skip the tasks still queued
        if workers:
            self._stop_processes(workers)
        if self._slots is not None:
            self._slots.close()
        if self._stop_flag is not None:
            self._stop_flag.close()

    @staticmethod
    def _stop_processes(workers: list) -> None:
        for w in workers:  # 1
            try:
                os.set_blocking(w.channels.tasks.fileno(), False)
                _send(w.channels.tasks, Stop())
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + _STOP_GRACE_S  # 2
        running = [w for w in workers if w.process.exitcode is None]
        while running and time.monotonic() < deadline:
            handles = {w.process.sentinel: w for w in running}
            handles.update({w.channels.results: w for w in running if not w.channels.results.closed})
            for handle in wait_ready(list(handles), max(0.0, deadline - time.monotonic())):
                w = handles[handle]
                if handle is w.channels.results:
                    try:
                        while w.channels.results.poll():
                            w.channels.results.recv_bytes()
                    except (EOFError, OSError):
                        w.channels.results.close()
            running = [w for w in running if w.process.exitcode is None]
        for w in running:  # 3
            w.process.kill()
        for w in workers:
            w.process.join(_REAP_TIMEOUT_S)
            w.channels.close()  # 4
            w.process.close()
