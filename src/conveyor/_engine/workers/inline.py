"""The inline worker (``num_workers=0``): batches loaded in the loop's own
thread, when the loop asks for them, through the same executor and the
same ``Serving.load`` as worker processes and threads.

    executor ──send: [Task]──▶ queue ──wait()──▶ Serving.load (here, now) ──▶ (worker, message)

What differs from the other kinds of workers, as torch's single-process
loading does it (its place: ``places.Inline``):

* nothing is loaded ahead: the executor's window is one batch, and a task
  runs only when ``wait`` is called for it;
* an iterable dataset's ``__iter__`` runs when the loader's does
  (:meth:`InlineWorkers.begin_epoch`), not at the first batch;
* the global generators are seeded for each batch and put back after it
  (they are the training loop's);
* ``collate_fn`` makes the batch as the user gets it (tensors from
  conveyor.torch's collate); nothing is encoded or decoded;
* the user's exception is raised as it is (``TaskFailed.exception``), and
  ``SystemExit`` or ``KeyboardInterrupt`` goes straight up;
* ``get_worker_info()`` answers None and ``worker_init_fn`` is not called;
* there is nothing to kill, map or pickle: no slots, no pipes, and a forked
  child of the user's process may go on with the iterator.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..loading.copies import CopyState
from ..loading.serving import Serving, WorkerConfig, WorkerFds
from ..transport.messages import Batch, Task
from .protocol import AllAtOnce, NoSlots, task_of_epoch
from .stacks import thread_stack


@dataclass(eq=False)
class InlineHandle:
    """The executor's view of the inline worker (a workers.WorkerView)."""

    id: int = 0
    outstanding: deque = field(default_factory=deque)
    active: bool = True
    exited: bool = False
    busy_since: float = 0.0
    #: Ready from the start: setting up is making a fetcher, nothing to wait for.
    ready: bool = True
    #: (worker id, pid) in a batch's timings: the main process's.
    timing_ids: tuple = (-1, 0)
    #: The thread that loads (the loop's), for its stack.
    thread: Optional[int] = None

    @property
    def pid(self) -> int:
        return os.getpid()

    def current(self, epoch_id: int) -> Optional[Task]:
        return task_of_epoch(self.outstanding, epoch_id)

    def describe(self) -> str:
        return "the main process"

    def stack_text(self) -> str:
        return thread_stack(self.thread)


class InlineWorkers(NoSlots, AllAtOnce):
    """One worker that loads in the caller's thread (a workers.Workers)."""

    #: A forked child of the user's process may go on with an inline iterator.
    process_bound = False
    #: Nothing crosses: collate_fn makes the batch as the user gets it.
    transports = False

    def __init__(self) -> None:
        self.workers: list[InlineHandle] = []
        self._queue: deque = deque()
        self._serving: Optional[Serving] = None

    def start(
        self, make_config: Callable[[int, WorkerFds, tuple], WorkerConfig], num_workers: int, num_slots: int
    ) -> None:
        """Make the one worker's fetcher (no process, no thread, no slots)."""
        config = make_config(0, WorkerFds(), ())
        self._serving = Serving(config, config.place.set_up(config))
        self.workers = [InlineHandle()]

    def begin_epoch(self, epoch_id: int, restore: dict[int, CopyState]) -> Optional[dict[int, CopyState]]:
        """Start the epoch now: an iterable dataset's ``__iter__`` runs (its
        copy continues from ``restore[0]`` when given); where each copy
        stands then ({0: state}), None for a map-style dataset."""
        self._queue.clear()
        state = self._serving.begin_epoch(epoch_id, restore.get(0)) if self._serving is not None else None
        return None if state is None else {0: state}

    @property
    def watched(self) -> bool:
        return self._serving is not None

    @property
    def small_batches(self) -> bool:
        return False

    def send(self, worker: InlineHandle, tasks: list[Task]) -> None:
        self._queue.extend(tasks)

    def wait(self, timeout_s: Optional[float]) -> list[tuple[InlineHandle, Any]]:
        """Load the next task sent, now, in this thread; [] when none is waiting."""
        if not self._queue or self._serving is None:
            return []
        worker = self.workers[0]
        worker.thread = threading.get_ident()
        return [(worker, self._serving.load(self._queue.popleft()))]

    def decode(self, worker: InlineHandle, task: Task, message: Batch) -> Any:
        return message.data

    def exit_error(self, worker: InlineHandle, what: Optional[str], starting: bool = False) -> BaseException:
        return RuntimeError("conveyor: the inline worker cannot end on its own")  # (never asked: it does not exit)

    def stop(self) -> None:
        """Let go of the fetcher's reading threads; safe to call twice."""
        serving, self._serving = self._serving, None
        self._queue.clear()
        if serving is not None:
            serving.close()

    def let_go(self) -> None:
        """In a forked child: nothing is shared with the parent to let go of."""
