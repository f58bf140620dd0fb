"""The executor's window: the pass's tasks, taken from the plan as room
frees up, each booked for the worker the dataset's kind chooses.

    plan (Tasks) ──fill──▶ choose a worker (kinds.py) ──▶ book: slot, restore, fill threads
                 ──▶ pending (by batch index) + the worker's outstanding ──▶ Workers.send (a round's together)

At most ``prefetch_factor × workers`` batches lie between the plan and
delivery (those sent and not answered, and those waiting for their turn);
more while batches are small (SMALL_BATCH_WINDOW). Sending never waits.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Iterator, Optional

from ..cpu import usable_cores
from ..transport.messages import Task
from ..workers.protocol import Workers, WorkerView
from .records import Running

#: Batches in flight per worker while batches are small (Workers.small_batches)
#: and the user left prefetch_factor to conveyor: each then costs its round
#: trip, not memory, and a deeper queue lets a worker go on while the main
#: process is busy (bench b: about 1.6x the batches/s). A prefetch_factor
#: the user gives is a bound, kept exactly.
SMALL_BATCH_WINDOW = 16

#: Threads filling the self-filling leaves of an epoch's first batch (rows.RowPlacer):
#: one per usable core, so that the batch the loop waits for does not wait for
#: one thread while the other workers are still starting.
FIRST_BATCH_FILL_THREADS = usable_cores()


class Dispatcher:
    """Hands the pass's tasks to the workers of ``pool``, keeping the
    window full; knows which tasks are out (``pending``) and whether the
    plan has more (``plan_done``)."""

    def __init__(self, pool: Workers, running: Running, kind: Any):
        self._pool, self._running, self._kind = pool, running, kind
        self._tasks: Iterator[Task] = iter(())
        #: The plan has no more tasks (or no worker is left to take one).
        self.plan_done = True
        #: Tasks sent to a worker and not answered yet, by batch index (one
        #: dict for the dispatcher's life: the executor reads it too).
        self.pending: dict[int, Task] = {}
        #: Worker id -> where its iterable copy resumes, for its first task.
        self.restore: dict[int, Any] = {}
        self._turn = 0  # (whose turn it is: round robin starts at worker 0, as torch's)
        #: The next task is an epoch's first (the loop waits for it while the other workers start).
        self._first_task = False
        #: That first batch's index (it loads while it is pending).
        self._first_batch: Optional[int] = None

    def begin(self, tasks: Iterator[Task], turn: int, restore: dict[int, Any]) -> None:
        """A pass begins: its plan, whose turn is first, where copies resume."""
        self._tasks = tasks
        self.plan_done = False
        self.pending.clear()
        self._first_task = True
        self._turn = turn
        self.restore = restore

    def fill(self, waiting: int) -> None:
        """Fill the window (``waiting``: batches back and waiting for their
        turn); the tasks of one round go to each worker together."""
        cfg = self._running
        deepen = cfg.deepen_small and self._pool.small_batches
        limit = cfg.workers * (max(cfg.prefetch_factor, SMALL_BATCH_WINDOW) if deepen else cfg.prefetch_factor)
        workers = self._pool.workers
        batches: dict[int, list[Task]] = {}
        try:
            while not self.plan_done and len(self.pending) + waiting < limit:
                worker = self._choose_worker(workers)
                if worker is None:
                    if not any(w.active and not w.exited for w in workers):
                        self.plan_done = True
                    break
                try:
                    task = next(self._tasks)  # the user's sampler runs here
                except StopIteration:
                    self.plan_done = True
                    break
                batches.setdefault(worker.id, []).append(self._assign(worker, task))
        finally:  # (also when the sampler raised: what was booked must be sent)
            for wid, tasks in batches.items():
                self._pool.send(workers[wid], tasks)

    def _choose_worker(self, workers: list) -> Optional[WorkerView]:
        """Who loads the next batch, as the dataset's kind says (kinds.py)."""
        cfg = self._running
        worker, self._turn = self._kind.choose(workers, self._turn, cfg.in_order, cfg.prefetch_factor)
        return worker

    def _assign(self, worker: WorkerView, task: Task) -> Task:
        """Book ``task`` for ``worker``: a slot, where its copy resumes, its
        fill threads, its place in the queues; the booked task (a new one)."""
        slot, restore = self._pool.lend_slot(), self.restore.pop(worker.id, None)
        booked = replace(task, slot=slot, restore=restore, fill_threads=self._fill_threads(worker, task.batch_index))
        if not worker.outstanding:
            worker.busy_since = time.monotonic()
        worker.outstanding.append(booked)
        self.pending[booked.batch_index] = booked
        return booked

    def _fill_threads(self, worker: WorkerView, batch_index: int) -> int:
        """How the batch's self-filling leaves (decoded images: rows.RowPlacer)
        are filled: an epoch's first batch, which the loop waits for, with a
        thread per core; another worker's first batch while that one loads
        (0): its worker first holds while the first batch fills, then fills
        as usual; if the first batch still fills after
        process.FIRST_BATCH_HOLD_S, at a lower CPU priority, so as not to
        take the cores from it; else 1."""
        if self._first_task:
            self._first_task, self._first_batch = False, batch_index
            return FIRST_BATCH_FILL_THREADS
        if self._first_batch in self.pending and not worker.outstanding:  # (the batch will be its only one)
            return 0
        return 1
