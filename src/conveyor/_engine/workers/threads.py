"""Thread workers (``worker_method="thread"``): the worker loop in threads of
the main process, for datasets that wait on I/O rather than compute.

    executor ──send: [Task, …]──▶ inbox (one per thread) ──▶ Serving.load ──▶ results queue ──▶ wait
                                                               (fetch + collate, numpy leaves)

Each thread sets up as a worker process does (``places.InThread``: its own
``get_worker_info()``, ``worker_init_fn``, its own fetcher; its own shallow
copy of an iterable dataset, so its own iterator and attributes), then serves
its tasks in order with the same code (loading/serving.py's ``Serving``),
so errors, timings, resume and batches are those of process workers. What
differs, because a thread shares its process:

* the batch is handed over as it is: no pickling, no shared memory;
* the global generators (``random``, ``numpy.random``, torch's) belong to
  the training loop and are not seeded per batch; ``conveyor.sample_rng()``
  and ``get_worker_info().rng`` give every sample the same draws as under
  processes;
* torch's intra-op threads are the process's (no ``set_num_threads(1)``);
* a thread cannot be killed: one stuck in user code when the loader stops
  ends when that call returns (it takes no further task), and a stop waits
  for it at most ``STOP_GRACE_S``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import info as _info
from ..errors import WorkerDiedError
from ..loading.ending import Ending, fatal_message
from ..loading.serving import Serving, WorkerConfig, WorkerFds
from ..torch_hook import when_torch_loads
from ..transport.messages import Batch, Ready, Task
from .fleet import STOP_GRACE_S
from .protocol import EXITED, AllAtOnce, NoSlots, task_of_epoch
from .stacks import thread_stack


@dataclass(eq=False)
class ThreadHandle:
    """The executor's view of one worker thread (a workers.WorkerView)."""

    id: int
    thread: Optional[threading.Thread] = None
    #: Lists of tasks to serve, in order; None: stop.
    inbox: Any = field(default_factory=queue.SimpleQueue)
    outstanding: deque = field(default_factory=deque)
    active: bool = True
    exited: bool = False
    busy_since: float = 0.0
    #: Why the thread ended, when it was not asked to (a traceback).
    crash: str = ""
    #: Ready only once it says so (it sets up in its own thread).
    ready: bool = False

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def timing_ids(self) -> tuple[int, int]:
        """(worker id, pid) in a batch's timings."""
        return self.id, os.getpid()

    def current(self, epoch_id: int) -> Optional[Task]:
        return task_of_epoch(self.outstanding, epoch_id)

    def describe(self) -> str:
        return f"worker thread {self.id}"

    def stack_text(self) -> str:
        """Its Python stack now."""
        return thread_stack(self.thread.ident if self.thread is not None else None)


class ThreadWorkers(NoSlots, AllAtOnce):
    """The worker threads of one executor (a workers.Workers)."""

    #: A forked child of the user's process finds no thread of this pool there.
    process_bound = True
    transports = True

    def __init__(self) -> None:
        self.workers: list[ThreadHandle] = []
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()

    def start(
        self, make_config: Callable[[int, WorkerFds, tuple], WorkerConfig], num_workers: int, num_slots: int
    ) -> None:
        """Start ``num_workers`` threads (no slots: batches are handed over as they are)."""
        when_torch_loads(_answer_torch_in_threads)
        for wid in range(num_workers):
            handle = ThreadHandle(wid)
            handle.thread = threading.Thread(
                target=_serve,
                args=(make_config(wid, WorkerFds(), ()), handle, self._results, self._stopping),
                name=f"conveyor-worker-{wid}",
                daemon=True,
            )
            self.workers.append(handle)
            handle.thread.start()

    @property
    def watched(self) -> bool:
        return any(not worker.exited for worker in self.workers)

    @property
    def small_batches(self) -> bool:
        """Never judged small: a thread hands its batch over as it is, at no
        cost per batch worth a deeper queue."""
        return False

    def begin_epoch(self, epoch_id: int, restore: dict) -> Optional[dict]:
        """Threads start each epoch at its first task (``Task.restore``): nothing to do now."""
        return None

    def send(self, worker: ThreadHandle, tasks: list[Task]) -> None:
        worker.inbox.put(tasks)

    def wait(self, timeout_s: Optional[float]) -> list[tuple[ThreadHandle, Any]]:
        """What the threads have sent since the last wait, in order; [] at the timeout."""
        try:
            first = (
                self._results.get(timeout=timeout_s)
                if timeout_s is None or timeout_s > 0
                else self._results.get_nowait()
            )
        except queue.Empty:
            return []
        arrived = [first]
        while True:
            try:
                arrived.append(self._results.get_nowait())
            except queue.Empty:
                break
        for worker, message in arrived:
            if message is EXITED:
                worker.exited = True
                worker.thread.join(STOP_GRACE_S)
        return arrived

    def decode(self, worker: ThreadHandle, task: Task, message: Batch) -> Any:
        return message.data

    def exit_error(self, worker: ThreadHandle, what: Optional[str], starting: bool = False) -> BaseException:
        doing = f"It was loading {what}." if what is not None else "It had no batch in hand."
        text = f"DataLoader worker thread {worker.id} ended unexpectedly (conveyor: {doing})"
        if worker.crash:
            text += f"\n{worker.crash}"
        return WorkerDiedError(text)

    def stop(self) -> None:
        """Tell every thread to stop and wait for them, up to ``STOP_GRACE_S``
        in all; a thread still in user code ends when that call returns."""
        workers, self.workers = self.workers, []
        self._stopping.set()
        for worker in workers:
            worker.inbox.put(None)
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in workers:
            if worker.thread is not None and worker.thread is not threading.current_thread():
                worker.thread.join(max(0.0, deadline - time.monotonic()))

    def let_go(self) -> None:
        """In a forked child the threads do not exist: forget them."""
        self.workers = []


def _serve(config: WorkerConfig, handle: ThreadHandle, results: queue.SimpleQueue, stopping: threading.Event) -> None:
    """The thread: set up, say Ready, serve tasks until told to stop; its
    last word is always EXITED."""
    wid = config.worker_id
    fetcher = serving = None
    try:
        try:
            fetcher = config.place.set_up(config)  # (places.InThread: its WorkerInfo, worker_init_fn, its copy)
        except BaseException:
            results.put((handle, fatal_message(wid, config.where, "start")))
            return
        results.put((handle, Ready(wid)))
        serving = Serving(config, fetcher)
        while not stopping.is_set():
            tasks = handle.inbox.get()
            if tasks is None:
                return
            for task in tasks:
                if stopping.is_set():
                    return
                try:
                    message = serving.load(task)
                except Ending as ending:
                    results.put((handle, ending.fatal))
                    return
                results.put((handle, message))
    except BaseException:
        handle.crash = traceback.format_exc()
    finally:
        if serving is not None:
            serving.close()  # (and the reading threads of reads_in_flight)
        elif fetcher is not None and callable(getattr(fetcher, "close", None)):
            fetcher.close()
        _info.set_thread_info(None)
        results.put((handle, EXITED))


def _answer_torch_in_threads(torch: Any) -> None:
    """Let ``torch.utils.data.get_worker_info()`` answer in worker threads
    too (torch keeps one answer per process): the module's function is
    replaced, once, by one that gives a worker thread's own info and
    otherwise calls torch's. A name imported from torch before this ran
    keeps torch's function (``conveyor.get_worker_info()`` always answers)."""
    try:
        from torch.utils import data as torch_data
        from torch.utils.data._utils import worker as torch_worker
    except Exception:
        return
    original = torch_worker.get_worker_info
    if getattr(original, "_conveyor_threads", False):
        return

    def get_worker_info() -> Any:
        mine = _info.thread_info()
        if mine is None:
            return original()
        fields = dict(id=mine.id, num_workers=mine.num_workers, seed=mine.seed, dataset=mine.dataset)
        try:
            return torch_worker.WorkerInfo(**fields, rng=mine.rng, worker_method=mine.worker_method)
        except TypeError:  # (a torch whose WorkerInfo has neither field)
            return torch_worker.WorkerInfo(**fields)

    get_worker_info.__doc__ = original.__doc__
    get_worker_info._conveyor_threads = True  # type: ignore[attr-defined]
    torch_worker.get_worker_info = get_worker_info
    torch_data.get_worker_info = get_worker_info
