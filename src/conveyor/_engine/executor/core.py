"""The executor that runs fetch + collate in workers: inline (``num_workers=0``,
workers/inline.py), processes (workers/pool.py), threads of this process
(workers/threads.py) or Ray actors (workers/ray_actors.py), chosen once by
``worker_method`` (workers/choice.py).

    plan (Tasks) ──▶ dispatch ──Tasks──▶ workers ──Batch | TaskFailed | Exhausted──▶ collect
         ──▶ decode (views on a shared-memory slot, or the batch itself) ──▶ Delivered
         ──▶ ReorderBuffer ──▶ its turn: copies, timings completed ──▶ Delivered

Actors:
  * dispatch (dispatch.py): keeps ``prefetch_factor × num_workers``
    batches between plan and delivery (more for small batches); a round's
    tasks for one worker travel together; sending never waits.
  * collect: one wait over every worker's results and exits, so a dead
    worker is noticed the moment it dies; nothing is delivered before
    every worker said Ready (a failing ``worker_init_fn`` comes first).
  * reorder: in plan order (``in_order=True``) or as batches arrive.
  * watch: the stall watchdog warns when nothing has arrived for a while;
    ``timeout`` makes a late batch an error naming it.
  * one failure path (``_fail``) and one idempotent shutdown (``shutdown``).

This module drives the pass and its workers; a :class:`Workers` (the
workers package: ``InlineWorkers``, ``WorkerPool``, ``ThreadWorkers``,
``RayActorWorkers``)
reaches and ends them, and reports what cannot cross as :class:`Broken`.
A failure of one batch (the user's exception, a conversion to tensors) is
that batch's ``Delivered.error`` and the pool carries on, as in torch;
anything that breaks the pool (a dead worker, a message that cannot cross)
stops every worker and is raised by every later ``next_batch``.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import warnings
from functools import partial
from time import perf_counter
from typing import Any, Iterator, NoReturn, Optional

from ..errors import describe_indices, live_workers_error
from ..interrupts import raised_by_handler
from ..loading.copies import Copies
from ..loading.fetch import FetchSpec
from ..loading.serving import worker_config
from ..transport.messages import Batch, Exhausted, Fatal, Ready, Task, TaskFailed
from ..transport.slots import SPARE_SLOTS
from ..workers.choice import workers_for
from ..workers.protocol import EXITED, Broken, Workers, WorkerView
from . import failing
from .dispatch import Dispatcher
from .kinds import NoCopies
from .records import INTERRUPT_CHECK_S, SHUTDOWN_WAIT_S, Delivered, Interrupted, Lifecycle, Running
from .reorder import ReorderBuffer
from .results import batch_arrived, task_error
from .watchdog import BusyWorker, StallWarning, StallWatchdog, busy_workers


class PoolExecutor:
    """Runs fetch + collate in workers: inline, processes, threads or Ray actors.

    Keeps at most ``prefetch_factor × num_workers`` batches between dispatch
    and delivery; delivers in plan order (``in_order=True``) or as batches
    complete. Belongs to the process that created it: a forked child of
    that process can neither use it nor stop its workers.
    """

    def __init__(self, loading: FetchSpec, running: Running, base_seed: int):
        self.loading, self.running, self.base_seed = loading, running, base_seed
        self.state = Lifecycle.NEW
        self._owner_pid = os.getpid()
        self._pool: Workers = workers_for(running.method, running.ray, running.stagger)
        self._error: Optional[BaseException] = None
        #: Workers that have not said Ready yet; nothing is delivered until none.
        self._starting: set[int] = set()
        self._watchdog = StallWatchdog(running.stall_warning_s)
        # The pass in progress (begin_epoch).
        self._epoch_id = -1
        self._dispatch = Dispatcher(self._pool, running, loading.kind)
        #: Tasks sent to a worker and not answered yet, by batch index (the dispatcher's).
        self._pending = self._dispatch.pending
        self._reorder = ReorderBuffer(running.in_order)
        self._progress: Any = NoCopies()  # (where an iterable's copies stand: kinds.py)
        #: When the workers began to start, and when start() returned (a
        #: staggered start resumes at the first next(): the time between is
        #: the user's, not start-up's).
        self._started_at = self._start_returned_at = 0.0
        #: Seconds the workers took to be ready, until a delivered batch carries it.
        self._ready_s: Optional[float] = None
        #: Held by the thread inside next_batch (re-entrant: a pass a signal
        #: handler interrupts shuts it down from inside); shutdown takes it.
        self._inside = threading.RLock()

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        """Start every worker (for processes, after checking that what travels pickles)."""
        cfg = self.running
        self._started_at = perf_counter()
        try:
            self._pool.start(
                partial(worker_config, self.loading, cfg, self.base_seed, self._owner_pid),
                cfg.workers,
                cfg.prefetch_factor * cfg.workers + SPARE_SLOTS,
            )
        except BaseException:
            self.shutdown()
            raise
        self._starting = {worker.id for worker in self._workers if not worker.ready}
        self.state = Lifecycle.RUNNING
        self._start_returned_at = perf_counter()

    @property
    def _workers(self) -> list[WorkerView]:
        return self._pool.workers

    # ----------------------------------------------------------------- epoch
    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[Task],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[Copies] = None,
    ) -> Optional[Copies]:
        """Start a new pass over ``tasks`` (the plan's: epoch, index, seed,
        indices; each booked as it is sent, dispatch.py); results of an
        abandoned pass are dropped on arrival.

        A resumed epoch's plan starts at batch ``first_index`` and leaves out
        the batches in ``skip`` (delivered before the resume, with
        ``in_order=False``); in-order delivery starts at ``first_index`` and
        passes over ``skip``. For an iterable dataset, ``workers_resume`` (a
        saved ``copies``) puts each worker's copy back where it
        stood, retires the workers that had run out and gives the next turn
        to the worker whose turn it was. Returns where the copies start:
        ``workers_resume`` (None: each worker makes a fresh copy of the
        dataset, which stays as it is in this process).
        """
        self._raise_if_unusable()
        self._epoch_id = epoch_id
        for worker in self._workers:
            worker.active = True
        self._progress = progress = self.loading.kind.progress(len(self._workers), workers_resume)
        self._dispatch.begin(tasks, progress.next_turn, progress.restore_points())
        for wid in progress.retired:
            self._workers[wid].active = False
        self._reorder = ReorderBuffer(self.running.in_order, first_index, skip, progress.passed)
        started = self._pool.begin_epoch(epoch_id, self._dispatch.restore)
        if started is None:
            return workers_resume
        self._dispatch.restore = {}  # (loaded already, where the copies started)
        for wid, state in started.items():
            self._progress.started(wid, state)
        return self._progress.snapshot()

    def send_first(self) -> None:
        """What next_batch does first, done now from the caller's thread: the
        first tasks sent, and the workers a staggered start left started
        (so that a thread driving the executor later, the pin thread, never
        forks while the caller's thread runs the user's code)."""
        with self._inside:
            self._check_owner()
            self._raise_if_unusable()
            self._dispatch.fill(len(self._reorder))
            self._start_rest()

    def next_batch(self, until: Optional[threading.Event] = None) -> Delivered:
        """The next batch of this epoch; StopIteration at its end, whose
        ``value`` is the final ``copies`` (iterable datasets) or None.

        ``until``: an event another thread sets to call the wait off (the pin
        thread's stop): Interrupted is raised within ``INTERRUPT_CHECK_S``
        of it, between two steps, and the executor stays usable. One thread
        at a time is inside; a shutdown from another thread waits for it
        to leave (:meth:`shutdown`)."""
        with self._inside:
            return self._next_batch(until)

    def _next_batch(self, until: Optional[threading.Event]) -> Delivered:
        self._check_owner()
        self._raise_if_unusable()
        deadline = time.monotonic() + self.running.timeout_s if self.running.timeout_s > 0 else None
        self._watchdog.waiting()
        try:
            while True:
                self._raise_if_unusable()  # (shut down meanwhile, from another thread)
                if until is not None and until.is_set():
                    raise Interrupted
                if not self._starting:
                    waiting = self._reorder.take()
                    if waiting is not None:
                        return self._delivered(waiting)
                self._dispatch.fill(len(self._reorder))
                self._start_rest()
                if self._dispatch.plan_done and not self._pending and not len(self._reorder):
                    self._reorder.finish()
                    # The value: where the workers' copies stand at the end (iterable datasets).
                    raise StopIteration(self._progress.snapshot())
                self._wait(deadline)
        except Broken as exc:
            if raised_by_handler(exc.cause):
                raise exc.cause from None  # (the user's interruption, not a message that could not cross)
            broken = exc  # (broken outside the except: nothing raised now chains to it)
        self._break(broken)

    def _delivered(self, waiting: Delivered) -> Delivered:
        """A batch's turn: where the copies stand as of it, its timings completed."""
        self._progress.handed_over(waiting.batch_index)
        timings = waiting.timings
        if timings is not None:
            ready_s, self._ready_s = self._ready_s, None  # (told once: with the first batch after the workers started)
            timings = timings.on_delivery(ready_s, self._pool.slots_in_use())
        return Delivered(
            waiting.batch_index,
            waiting.data,
            waiting.error,
            self._progress.snapshot(),
            timings,
            waiting.skipped,
            waiting.empty,
        )

    def _start_rest(self) -> None:
        """Start the workers a staggered start left, now that the first
        tasks are in their pipes (a failure to start one is the pass's)."""
        resumed_at = perf_counter()
        try:
            started = self._pool.start_rest()
        except Exception as exc:
            if raised_by_handler(exc):
                raise
            self._fail(exc)
        if started:  # (workers_ready_s leaves out the wait between iter() and the first next())
            self._started_at += resumed_at - self._start_returned_at

    # ------------------------------------------------------------- collect
    def _wait(self, deadline: Optional[float]) -> None:
        """Wait for results, a worker's end, the deadline or the watchdog (at
        most ``INTERRUPT_CHECK_S``: next_batch looks for a call-off or a
        shutdown between waits), and take them in."""
        if not self._pool.watched:
            raise RuntimeError("every DataLoader worker has stopped; nothing is left to wait for")
        wait_s = self._watchdog.wait_s(deadline)
        arrived = self._pool.wait(INTERRUPT_CHECK_S if wait_s is None else min(wait_s, INTERRUPT_CHECK_S))
        if not arrived:
            if deadline is not None and time.monotonic() >= deadline:
                self._on_timeout()
            if self._watchdog.due():
                self._warn_stall()
            return
        for worker, message in arrived:
            if message is EXITED:
                self._on_worker_exit(worker)
            else:
                self._handle(worker, message)

    def _handle(self, worker: WorkerView, message: Any) -> None:
        if isinstance(message, Ready):
            self._starting.discard(message.worker_id)
            if not self._starting:
                self._ready_s = perf_counter() - self._started_at
            return
        if isinstance(message, Fatal):
            self._on_fatal(worker, message)
        sent = worker.outstanding.popleft() if worker.outstanding else None
        worker.busy_since = time.monotonic()  # it starts on its next task now
        self._watchdog.arrived()
        if sent is None or message.epoch_id != self._epoch_id or message.batch_index not in self._pending:
            self._pool.give_back(sent.slot if sent is not None else None)
            return  # a result of an abandoned epoch
        task = self._pending.pop(message.batch_index)
        index = message.batch_index
        if isinstance(message, Batch):
            self._reorder.put(
                index, batch_arrived(self._pool, worker, sent, message, self.loading.to_torch and self._pool.transports)
            )
            self._progress.arrived(index, worker.id, message.worker_state)
            return
        self._pool.give_back(sent.slot)
        if isinstance(message, Exhausted):
            worker.active = False
            self._progress.exhausted(index, worker.id, message.worker_state)
            self._reorder.retire(index)
        elif isinstance(message, TaskFailed):
            self._reorder.put(
                index, Delivered(index, error=task_error(worker, message, task, self.running.place.names))
            )
            self._progress.arrived(index, worker.id, None)

    # ------------------------------------------------------------- watching
    def _busy(self, with_stacks: bool = False) -> list[BusyWorker]:
        return busy_workers(self._workers, self._epoch_id, self._pending, self._starting, with_stacks)

    def _warn_stall(self) -> None:
        # (stacklevel: past _wait, _next_batch, next_batch and the iterator's _take, _next and __next__, to the
        # line of the user's loop; from a pin thread the warning has no user's line to point at)
        warnings.warn(self._watchdog.report(self._busy(with_stacks=True)), StallWarning, stacklevel=8)

    def _on_timeout(self) -> None:
        # Terminal, unlike torch: something is stuck, and the workers are
        # stopped now rather than whenever the traceback lets the iterator go.
        wanted = self._reorder.next_index if self.running.in_order else None
        task = self._pending.get(wanted) if wanted is not None else None
        self._fail(failing.timeout_error(self.running.timeout_s, self._busy(), wanted, task))

    # ------------------------------------------------------------- failures
    def _on_fatal(self, worker: WorkerView, fatal: Fatal) -> None:
        """User code ended the worker (set-up failed, SystemExit, KeyboardInterrupt)."""
        self._fail(failing.fatal_error(worker, fatal, self.running.place.names, self._epoch_id, self._what))

    def _on_worker_exit(self, worker: WorkerView) -> None:
        if self.state is not Lifecycle.RUNNING:
            return
        starting = worker.id in self._starting  # (it never said Ready: the start failed, not a batch)
        sent = worker.current(self._epoch_id)
        what = self._what(sent.batch_index) if sent is not None and sent.batch_index in self._pending else None
        self._fail(self._pool.exit_error(worker, None if starting else what, starting))

    def _break(self, broken: Broken) -> NoReturn:
        """A message could not cross between this process and a worker."""
        self._fail(failing.broken_error(broken, self._epoch_id, self._what))

    def _what(self, batch_index: Optional[int]) -> str:
        """ "batch 3 (sample indices [6, 7])", for messages."""
        if batch_index is None:
            return "a batch"
        task = self._pending.get(batch_index)
        return f"batch {batch_index}" + (f" ({describe_indices(task.indices)})" if task is not None else "")

    def _fail(self, error: BaseException) -> NoReturn:
        """The one failure path: remember, stop everything, raise; later
        calls raise the same error."""
        self._error = error
        self.state = Lifecycle.BROKEN
        self._pool.stop()
        raise self._fresh_error()

    @property
    def broken(self) -> bool:
        return self._error is not None

    @property
    def usable(self) -> bool:
        """Started, neither broken nor shut down (as an interrupted pass leaves it: loader/_iteration.py)."""
        return self.state is Lifecycle.RUNNING

    def __reduce__(self) -> tuple:
        """Refused, naming the workers: a loader that keeps its workers
        (persistent_workers=True) cannot be pickled or deep-copied with them."""
        raise live_workers_error([worker.describe() for worker in self._workers], self.running.place.names)

    def _fresh_error(self) -> BaseException:
        """A copy of the stored error to raise. The stored one is never raised
        itself: a traceback on it would hold the frames (iterator, loader)
        of the call that raised it, and the executor would keep them alive."""
        stored = self._error
        assert stored is not None  # (asked only once broken)
        try:
            error = copy.copy(stored)
        except Exception:
            return stored
        error.__cause__ = stored.__cause__
        return error

    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            raise self._fresh_error()
        if self.state is Lifecycle.CLOSED:
            raise RuntimeError("this DataLoader iterator has been shut down; start a new one with iter(loader)")

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid and self._pool.process_bound:
            raise RuntimeError(
                f"this DataLoader iterator belongs to process {self._owner_pid}, whose workers a forked "
                f"child cannot use; start a new iterator (iter(loader)) in this process"
            )

    # ------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Stop the pool. Safe to call twice, from a finalizer, at exit, from
        another thread than the one inside next_batch (it waits for that one
        to leave), or in a forked child (which only lets go of its copies)."""
        if self.state is not Lifecycle.BROKEN:
            self.state = Lifecycle.CLOSED
        if os.getpid() != self._owner_pid and self._pool.process_bound:
            self._pool.let_go()
            return
        # A thread inside next_batch (the pin thread) sees the state within
        # INTERRUPT_CHECK_S and leaves; the workers stop once it is out. One
        # stuck longer (in a dataset's code, without workers) is not waited for.
        inside_left = self._inside.acquire(timeout=SHUTDOWN_WAIT_S)
        try:
            self._pool.stop()
        finally:
            if inside_left:
                self._inside.release()
