"""The worker processes of one executor, and what they share: start them,
watch them, stop them.

    WorkerPool.start ──▶ slots (SlotPool) + stop flag, then WorkerHandle 0..N-1
                         (fleet.py): process, pipes, stack file, tasks outstanding;
                         staggered: worker 0's process now, the others' at start_rest
    WorkerPool.send ───▶ tasks pickled into the task pipe (never waits: transport/wire.py)
    WorkerPool.wait ───▶ Poller: one poll over every result pipe, every sentinel, and
                         the task pipes with bytes waiting for room ──▶ messages, exits
    WorkerPool.decode ─▶ views on the batch's slot (transport/slots.py)
    WorkerPool.stop ───▶ stop flag + Stop ──▶ drain ──▶ grace ──▶ kill ──▶ reap ──▶ close

The executor (executor/core.py) decides what each worker does; this module
only knows how to reach them, read them and end them (workers.Workers).
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from typing import Any, Optional

from ..errors import death_error, start_death_error
from ..loading.serving import WorkerFds
from ..transport.messages import Batch, Task
from ..transport.pickling import check_picklable
from ..transport.slot_pool import SlotPool
from ..transport.slots import INLINE_MAX_BYTES, StopFlag
from .fleet import REAP_TIMEOUT_S, Fleet, MakeConfig, WorkerHandle, stop_workers
from .poller import Event, Poller
from .protocol import EXITED, Broken

#: A batch under this many bytes (its frame and its slot bytes) is small: see
#: WorkerPool.small_batches. The size under which batches travel inline.
SMALL_BATCH_BYTES = INLINE_MAX_BYTES
#: Batches over which "the recent batches" are judged, and how many must
#: have come before any judgement.
_SIZE_BLOCK = 64
_SIZE_FIRST = 8


class WorkerPool:
    """The worker processes of one executor and what they share (a
    workers.Workers).

    Ownership: the pool creates the slots, the stop flag and one stack file
    per worker before the workers start, and closes them in :meth:`stop`
    (batches the user holds stay valid: their mappings outlive the
    descriptors). ``slots`` and ``stop_flag`` are None where memfd is
    unavailable: batches then travel through the pipes.
    """

    def __init__(self, method: str, stagger: bool = False) -> None:
        self.method = method
        #: Start worker 0 alone, the others at start_rest (fork only: a
        #: spawned worker's config must precede its tasks in its pipe).
        self.stagger = stagger and method == "fork"
        self._fleet: Optional[Fleet] = None
        #: Workers a staggered start left for start_rest.
        self._rest_left = False
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

    def start(self, make_config: MakeConfig, num_workers: int, num_slots: int) -> None:
        """Check that what travels pickles (spawn, forkserver), make the
        shared memory, start the workers (staggered: worker 0 only) and
        watch them; on a failure, stop what started and raise."""
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
            self._fleet = Fleet(
                self.method,
                make_config,
                self.stop_flag.fd if self.stop_flag is not None else None,
                self.slots.fds if self.slots is not None else (),
            )
            self.workers = self._fleet.start(num_workers, now=1 if self.stagger else num_workers)
            self._rest_left = self.stagger and num_workers > 1
        except BaseException:
            self.stop()
            raise
        for worker in self.workers:
            if worker.process is not None:
                self.poller.watch(worker)

    def start_rest(self) -> bool:
        """Start the workers a staggered start left (their tasks wait in their
        pipes) and watch them; whether any started (none once all have). On
        a failure, stop the pool and raise."""
        if not self._rest_left or self._fleet is None:
            return False
        self._rest_left = False
        try:
            started = self._fleet.start_rest(self.workers)
        except BaseException:
            self.stop()
            raise
        for worker in started:
            self.poller.watch(worker)
        return bool(started)

    # ------------------------------------------------------------ messages
    @property
    def watched(self) -> bool:
        return self.poller.watched

    def send(self, worker: WorkerHandle, tasks: list[Task]) -> None:
        """The tasks, pickled, in one frame; what the pipe does not take now
        is written when ``wait`` finds room."""
        parts = []
        for task in tasks:
            slot_file = self.slots.files[task.slot] if task.slot is not None and self.slots is not None else None
            if slot_file is not None:  # (its slot's first file was retired: the task sent says where it is now)
                task = dataclasses.replace(task, slot_file=slot_file)
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
            worker.started.join(REAP_TIMEOUT_S)
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
            return start_death_error(worker.pid, worker.started.exitcode, worker.id, self.method, report)
        if what is None:
            doing = "It had no batch in hand."
        elif worker.channels.results.partial:
            doing = f"It was sending the result of {what}."
        else:
            doing = f"It was loading {what}."
        return death_error(worker.pid, worker.started.exitcode, worker.id, doing, report)

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
