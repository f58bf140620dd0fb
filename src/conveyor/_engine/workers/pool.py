"""The worker processes of one executor, and what they share: start them,
watch them, stop them.

    WorkerPool.start ──▶ slots (SlotPool) + stop flag, then WorkerHandle 0..N-1:
                         process, pipes, stack file, tasks outstanding
    WorkerPool.send ───▶ tasks pickled into the task pipe (never waits: transport/wire.py)
    WorkerPool.wait ───▶ Poller: one poll over every result pipe, every sentinel, and
                         the task pipes with bytes waiting for room ──▶ messages, exits
    WorkerPool.decode ─▶ views on the batch's slot (transport/slots.py)
    WorkerPool.stop ───▶ stop flag + Stop ──▶ drain ──▶ grace ──▶ kill ──▶ reap ──▶ close

The executor (executor/core.py) decides what each worker does; this module
only knows how to reach them, read them and end them (workers.Workers).
"""

from __future__ import annotations

import math
import pickle
import select
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import death_error, start_death_error
from .launch import Channels, WorkerProcess, deliver_config, pickle_config, start_worker
from ..transport.messages import Batch, Stop, Task
from ..transport.pickling import check_picklable
from ..transport.slots import INLINE_MAX_BYTES, SlotPool, StopFlag
from .stacks import StackFile
from ..transport.wire import pack
from ..loading.serving import WorkerConfig, WorkerFds
from .poller import Event, Poller, fileno
from .protocol import EXITED, Broken, task_of_epoch

#: After Stop, how long workers get to finish and exit before they are killed.
#: Short: workers hold nothing that needs a graceful end, and users wait on it.
STOP_GRACE_S = 0.5
#: How long to wait for a killed worker to be reaped (the kernel is quick).
REAP_TIMEOUT_S = 2.0
#: A batch under this many bytes (its frame and its slot bytes) is small: see
#: WorkerPool.small_batches. The size under which batches travel inline.
SMALL_BATCH_BYTES = INLINE_MAX_BYTES
#: Batches over which "the recent batches" are judged, and how many must
#: have come before any judgement.
_SIZE_BLOCK = 64
_SIZE_FIRST = 8


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
    #: Ready only once it says so (it sets up in its own process).
    ready: bool = False

    @property
    def timing_ids(self) -> tuple[int, int]:
        """(worker id, pid) in a batch's timings."""
        return self.id, self.process.pid

    def current(self, epoch_id: int) -> Optional[Task]:
        """The task of this epoch it is working on, if any."""
        return task_of_epoch(self.outstanding, epoch_id)

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> str:
        return f"worker {self.id} (pid {self.process.pid})"

    def stack_text(self) -> str:
        """Its Python stack, written by the worker on request (a signal; about 50 ms)."""
        return self.stack.request(self.process.pid) if self.stack is not None else ""


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
            for fd in (fileno(w.process.sentinel), w.channels.results.fd):
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
    """The worker processes of one executor and what they share (a
    workers.Workers).

    Ownership: the pool creates the slots, the stop flag and one stack file
    per worker before the workers start, and closes them in :meth:`stop`
    (batches the user holds stay valid: their mappings outlive the
    descriptors). ``slots`` and ``stop_flag`` are None where memfd is
    unavailable: batches then travel through the pipes.
    """

    def __init__(self, method: str) -> None:
        self.method = method
        self.workers: list[WorkerHandle] = []
        self.poller = Poller()
        self.slots: Optional[SlotPool] = None
        self.stop_flag: Optional[StopFlag] = None
        self._noted = False
        # The largest result (frame, or bytes in its slot) of the last
        # _SIZE_BLOCK results and of the block before: see small_batches.
        self._sizes = [0, 0, -_SIZE_FIRST]  # (this block's max, the last block's max, results this block)

    #: A forked child of the user's process must not use this pool's workers.
    process_bound = True
    transports = True

    def start(self, make_config: Callable[[int, WorkerFds, tuple], WorkerConfig], num_workers: int, num_slots: int) -> None:
        """Check that what travels pickles (spawn, forkserver), make the
        shared memory, start the workers and watch them; on a failure,
        stop what started and raise."""
        if self.method != "fork":
            config = make_config(0, WorkerFds(), ())
            fetch = config.fetch
            check_picklable(
                {"dataset": fetch.dataset, "collate_fn": fetch.collate_fn, "worker_init_fn": config.worker_init_fn},
                self.method,
            )
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
                self.method,
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

    # ------------------------------------------------------------ messages
    @property
    def watched(self) -> bool:
        return self.poller.watched

    def send(self, worker: WorkerHandle, tasks: list[Task]) -> None:
        """The tasks, pickled, in one frame; what the pipe does not take now
        is written when ``wait`` finds room."""
        parts = []
        for task in tasks:
            try:
                parts.append(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                raise Broken(worker, task.batch_index, "could not send the task of", exc) from None
        try:
            worker.channels.tasks.put(b"".join(parts))
        except BrokenPipeError:
            pass  # it is gone: its sentinel tells how, once what it sent is read
        self.poller.want_room(worker)

    def wait(self, timeout_s: Optional[float]) -> list[tuple[WorkerHandle, Any]]:
        """(worker, message) for each message read, then (worker, EXITED)
        for each worker whose process ended (reaped; everything it sent read
        first); [] at the timeout. Writes what waits for room in task pipes."""
        arrived: list[tuple[WorkerHandle, Any]] = []
        exited = []
        for worker, event in self.poller.wait(timeout_s):
            if event is Event.WRITABLE:
                self._flush(worker)
            elif event is Event.RESULT:
                self._receive(worker, arrived)
            else:
                exited.append(worker)
        for worker in exited:
            self._receive(worker, arrived, to_end=True)
            worker.exited = True
            self.poller.forget(worker)
            worker.process.join(REAP_TIMEOUT_S)
            arrived.append((worker, EXITED))
        return arrived

    def _flush(self, worker: WorkerHandle) -> None:
        try:
            worker.channels.tasks.flush()
        except BrokenPipeError:
            pass  # as in send
        self.poller.want_room(worker)

    def _receive(self, worker: WorkerHandle, into: list, to_end: bool = False) -> None:
        """Take what the worker has sent: what one read gives, or (once it
        has exited) everything up to the end of its pipe."""
        while True:
            try:
                payloads = worker.channels.results.read()
            except EOFError:
                self.poller.forget_results(worker)
                return
            for payload in payloads:
                try:
                    message = pickle.loads(payload)
                except Exception as exc:
                    raise Broken(worker, None, "could not read the result of", exc) from None
                if isinstance(message, Batch):
                    self._note_size(len(payload) + message.used)
                into.append((worker, message))
            if not (to_end and payloads):
                return

    def _note_size(self, nbytes: int) -> None:
        sizes = self._sizes
        sizes[0] = max(sizes[0], nbytes)
        sizes[2] += 1
        if sizes[2] >= _SIZE_BLOCK:
            sizes[:] = [0, sizes[0], 0]

    @property
    def small_batches(self) -> bool:
        """Whether the recent batches (at least ``_SIZE_FIRST``) were all small (under
        ``SMALL_BATCH_BYTES``, frame and slot bytes alike): the executor
        then keeps more of them in flight, since for such batches the cost is
        the round trip (wake-ups, system calls), not memory."""
        this_block, last_block, count = self._sizes
        return count >= 0 and max(this_block, last_block) < SMALL_BATCH_BYTES

    def decode(self, worker: WorkerHandle, task: Task, message: Batch) -> Any:
        """The batch's data: views on its slot (numpy leaves), or what came
        through the pipe when it did not fit."""
        if message.note and not self._noted:
            self._noted = True
            warnings.warn(
                f"conveyor: {message.note}. Batches that do not fit travel through pipes instead (same "
                f"data, slower). Free memory, or lower batch_size, prefetch_factor or num_workers.",
                stacklevel=7,
            )
        if task.slot is None or message.used == 0:
            self.give_back(task.slot)
            return message.data
        assert self.slots is not None  # (a slot was lent: there are slots)
        try:
            return self.slots.decode(message.data, task.slot, message.slot_size, message.used)
        except Exception as exc:
            raise Broken(worker, message.batch_index, "could not map the shared memory of", exc) from None

    def exit_error(self, worker: WorkerHandle, what: Optional[str], starting: bool = False) -> BaseException:
        """How it died, what it was doing, and its Python stack if it
        crashed, or what it printed if it died while starting."""
        report = worker.stack.crash_text() if worker.stack is not None else ""
        if starting:
            return start_death_error(worker.process.pid, worker.process.exitcode, worker.id, self.method, report)
        if what is None:
            doing = "It had no batch in hand."
        elif worker.channels.results.partial:
            doing = f"It was sending the result of {what}."
        else:
            doing = f"It was loading {what}."
        return death_error(worker.process.pid, worker.process.exitcode, worker.id, doing, report)

    def begin_epoch(self, epoch_id: int, restore: dict) -> Optional[dict]:
        """Workers start each epoch at its first task (``Task.restore``): nothing to do now."""
        return None

    # --------------------------------------------------------------- slots
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
            self.stop_flag = None  # (a second stop has no flag to raise)
