"""The worker processes of one executor, and what they share: start them,
watch them, stop them.

    WorkerPool.start ──▶ slots (SlotPool) + stop flag, then WorkerHandle 0..N-1:
                         process, pipes, stack file, tasks outstanding
    Poller ────────────▶ one poll over every result pipe, every sentinel, and the
                         task pipes that have bytes waiting for room
    WorkerPool.stop ───▶ stop flag + Stop ──▶ drain ──▶ grace ──▶ kill ──▶ reap ──▶ close

The executor decides what each worker does; this module only knows how to
reach them and how to end them.
"""

from __future__ import annotations

import enum
import math
import select
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .launch import Channels, WorkerProcess, deliver_config, pickle_config, start_worker
from .stacks import StackFile
from .worker import WorkerConfig, WorkerFds
from .wire import pack
from .messages import Stop
from .shm import SlotPool, StopFlag

#: After Stop, how long workers get to finish and exit before they are killed.
#: Short: workers hold nothing that needs a graceful end, and users wait on it.
STOP_GRACE_S = 0.5
#: How long to wait for a killed worker to be reaped (the kernel is quick).
REAP_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Sent:
    """A task sent to a worker and not answered yet."""

    epoch_id: int
    batch_index: int
    slot: Optional[int]


@dataclass(eq=False)
class WorkerHandle:
    """The main process's view of one worker."""

    id: int
    process: WorkerProcess
    channels: Channels
    #: Where the worker's stack is written on a crash or on request (None without memfd).
    stack: Optional[StackFile]
    #: Tasks sent and not yet answered, oldest first (a worker serves them in order).
    outstanding: deque = field(default_factory=deque)
    #: False once its copy of an iterable dataset ran out this epoch.
    active: bool = True
    exited: bool = False
    #: When it began the task in hand (time.monotonic()).
    busy_since: float = 0.0

    def current(self, epoch_id: int) -> Optional[Sent]:
        """The task of this epoch it is working on, if any."""
        for sent in self.outstanding:
            if sent.epoch_id == epoch_id:
                return sent
        return None

    def describe(self) -> str:
        return f"worker {self.id} (pid {self.process.pid})"


class Event(enum.Enum):
    RESULT = "result"  # its result pipe has bytes (or closed)
    EXIT = "exit"  # its process ended
    WRITABLE = "writable"  # its task pipe has room for what waits


class Poller:
    """One ``poll`` object over the workers' descriptors, kept from wait to
    wait: building a selector per wait, as ``multiprocessing.connection.wait``
    does, costs more than a small batch."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._by_fd: dict[int, tuple[WorkerHandle, Event]] = {}

    @property
    def watched(self) -> bool:
        return any(event is not Event.WRITABLE for _, event in self._by_fd.values())

    def _register(self, fd: int, worker: WorkerHandle, event: Event) -> None:
        self._poll.register(fd, select.POLLOUT if event is Event.WRITABLE else select.POLLIN)
        self._by_fd[fd] = (worker, event)

    def _unregister(self, fd: int) -> None:
        if self._by_fd.pop(fd, None) is not None:
            self._poll.unregister(fd)

    def watch(self, worker: WorkerHandle) -> None:
        self._register(worker.channels.results.fd, worker, Event.RESULT)
        self._register(_fileno(worker.process.sentinel), worker, Event.EXIT)
        self.want_room(worker)

    def want_room(self, worker: WorkerHandle) -> None:
        """Watch its task pipe for room while bytes wait to be written."""
        fd = worker.channels.tasks.fd
        if worker.channels.tasks.pending and not worker.exited:
            if fd not in self._by_fd:
                self._register(fd, worker, Event.WRITABLE)
        else:
            self._unregister(fd)

    def forget_results(self, worker: WorkerHandle) -> None:
        """Its result pipe reached its end: stop polling it (it would stay readable)."""
        self._unregister(worker.channels.results.fd)

    def forget(self, worker: WorkerHandle) -> None:
        for fd, (owner, _) in list(self._by_fd.items()):
            if owner is worker:
                self._unregister(fd)

    def wait(self, timeout_s: Optional[float]) -> list[tuple[WorkerHandle, Event]]:
        """(worker, event) for each ready descriptor; [] at the timeout."""
        timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout_ms) if fd in self._by_fd]


def _fileno(handle: Any) -> int:
    return handle if isinstance(handle, int) else handle.fileno()


def start_workers(
    method: str,
    make_config: Callable[[int, WorkerFds, tuple], WorkerConfig],
    num_workers: int,
    stop_fd: Optional[int],
    slot_fds: tuple,
) -> list[WorkerHandle]:
    """Start ``num_workers`` workers; ``make_config(worker_id, fds,
    close_fds)`` gives each its config. Under spawn the configs are queued
    on the task pipes, written by the poll loop as the workers read them.
    Stops what started if anything fails."""
    workers: list[WorkerHandle] = []
    try:
        for wid in range(num_workers):
            channels = Channels()
            stack = StackFile()
            fds = WorkerFds(stop=stop_fd, stack=stack.fd if stack else None, slots=slot_fds)
            close_fds = tuple(fd for w in workers for fd in w.channels.main_fds()) + channels.main_fds()
            config = make_config(wid, fds, close_fds)
            payload, payload_fds = pickle_config(config) if method == "spawn" else (None, ())
            try:
                process = start_worker(method, config, payload, channels, payload_fds)
            except BaseException:
                channels.close()
                if stack is not None:
                    stack.close()
                raise
            channels.close_worker_ends()
            workers.append(WorkerHandle(wid, process, channels, stack))
            deliver_config(method, channels, payload)
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[WorkerHandle]) -> None:
    """1. send Stop (without waiting for room; the caller has raised the shared
    stop flag, so queued tasks are skipped); 2. drain results and wait up to
    ``STOP_GRACE_S``; 3. kill what is left and reap it; 4. close pipes,
    sentinels and stack files."""
    for w in workers:  # 1
        try:
            w.channels.tasks.put(pack(Stop()))
        except OSError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S  # 2
    running = [w for w in workers if w.process.exitcode is None]
    ended: set[int] = set()  # result pipes that reached their end
    while running and time.monotonic() < deadline:
        poller = select.poll()
        by_fd = {}
        for w in running:
            for fd in (_fileno(w.process.sentinel), w.channels.results.fd):
                if fd not in ended:
                    by_fd[fd] = w
                    poller.register(fd, select.POLLIN)
        timeout_ms = max(1, math.ceil((deadline - time.monotonic()) * 1000))
        for fd, _ in poller.poll(timeout_ms):
            w = by_fd[fd]
            if fd == w.channels.results.fd and not w.channels.results.discard():
                ended.add(fd)
        running = [w for w in running if w.process.exitcode is None]
    for w in running:  # 3
        w.process.kill()
    for w in workers:
        w.process.join(REAP_TIMEOUT_S)
        w.channels.close()  # 4
        w.process.close()
        if w.stack is not None:
            w.stack.close()


class WorkerPool:
    """The workers of one executor and what they share.

    Ownership: the pool creates the slots, the stop flag and one stack file
    per worker before the workers start, and closes them in :meth:`stop`
    (batches the user holds stay valid: their mappings outlive the
    descriptors). ``slots`` and ``stop_flag`` are None where memfd is
    unavailable: batches then travel through the pipes.
    """

    def __init__(self) -> None:
        self.workers: list[WorkerHandle] = []
        self.poller = Poller()
        self.slots: Optional[SlotPool] = None
        self.stop_flag: Optional[StopFlag] = None

    def start(
        self,
        method: str,
        make_config: Callable[[int, WorkerFds, tuple], WorkerConfig],
        num_workers: int,
        num_slots: int,
    ) -> None:
        """Make the shared memory, start the workers and watch them; on a
        failure, stop what started and raise."""
        try:
            self.slots = SlotPool(num_slots)
        except OSError as exc:
            warnings.warn(
                f"conveyor: shared memory (memfd_create, shm_open) is unavailable here ({exc}); batches travel "
                f"through pipes instead (same data, slower).",
                stacklevel=6,
            )
        try:
            self.stop_flag = StopFlag() if self.slots is not None else None
            self.workers = start_workers(
                method,
                make_config,
                num_workers,
                self.stop_flag.fd if self.stop_flag is not None else None,
                tuple(self.slots.fds) if self.slots is not None else (),
            )
        except BaseException:
            self.stop()
            raise
        for worker in self.workers:
            self.poller.watch(worker)

    def lend_slot(self) -> Optional[int]:
        return self.slots.lend() if self.slots is not None else None

    def slots_in_use(self) -> int:
        """Slots lent out: batches in flight, waiting, or held by the user."""
        return self.slots.in_use if self.slots is not None else 0

    def give_back(self, slot: Optional[int]) -> None:
        """Return a slot that a message did not fill, or whose batch is dropped."""
        if self.slots is not None:
            self.slots.give_back(slot)

    def stop(self) -> None:
        """1. raise the shared stop flag (workers skip their queued tasks);
        2. stop the processes (:func:`stop_workers`); 3. close the shared
        memory. Safe to call twice."""
        workers, self.workers = self.workers, []
        if self.stop_flag is not None:
            self.stop_flag.set()  # 1
        for worker in workers:
            self.poller.forget(worker)
        if workers:
            stop_workers(workers)  # 2
        self._close_shared()  # 3

    def let_go(self) -> None:
        """In a forked child: close this process's copies of the descriptors,
        and touch nothing the parent's workers see (no flag, no Stop, no kill)."""
        workers, self.workers = self.workers, []
        for worker in workers:
            worker.channels.close()
            if worker.stack is not None:
                worker.stack.close()
        self._close_shared()

    def _close_shared(self) -> None:
        if self.slots is not None:
            self.slots.close()
        if self.stop_flag is not None:
            self.stop_flag.close()
