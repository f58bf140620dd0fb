"""The worker processes of one pool as a fleet: each worker's handle, and
how the fleet starts and stops.

    start_workers ──▶ pipes and a stack file for every worker ──▶ processes 0..now-1
    start_rest ─────▶ the processes of the others (staggered starts: see below)
    stop_workers ───▶ Stop ──▶ drain ──▶ grace ──▶ kill ──▶ reap ──▶ close

Staggered starts (``now=1``, under fork): every worker's pipes exist from
the start, so the executor books and sends tasks to every worker as usual,
but only worker 0 is forked when the pool starts; the others are forked
once the epoch's first task is in worker 0's pipe. Forking a process that
has torch and OpenCV loaded takes the main process about 5 ms per worker,
and the loop waits for that first batch: worker 0 loads it while the
others are forked. A worker not started yet has no process (``process`` is
None); its tasks wait in its pipe and it reads them once it starts.
"""

from __future__ import annotations

import math
import select
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..loading.serving import WorkerConfig, WorkerFds
from ..transport.messages import Stop, Task
from ..transport.wire import pack
from .launch import Channels, WorkerProcess, deliver_config, pickle_config, start_worker
from .poller import fileno
from .protocol import task_of_epoch
from .stacks import StackFile

#: After Stop, how long workers get to finish and exit before they are killed.
#: Short: workers hold nothing that needs a graceful end, and users wait on it.
STOP_GRACE_S = 0.5
#: How long to wait for a killed worker to be reaped (the kernel is quick).
REAP_TIMEOUT_S = 2.0

#: make_config(worker_id, fds, close_fds) -> the worker's WorkerConfig.
MakeConfig = Callable[[int, WorkerFds, tuple], WorkerConfig]


@dataclass(eq=False)
class WorkerHandle:
    """The main process's view of one worker."""

    id: int
    channels: Channels
    #: Where the worker's stack is written on a crash or on request (None without memfd).
    stack: Optional[StackFile]
    #: None until it is started (a staggered start: start_rest).
    process: Optional[WorkerProcess] = None
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
    def started(self) -> WorkerProcess:
        """Its process, which has started (asked only of a worker that has sent something or ended)."""
        assert self.process is not None, f"worker {self.id} has not started"
        return self.process

    @property
    def timing_ids(self) -> tuple[int, int]:
        """(worker id, pid) in a batch's timings."""
        return self.id, self.started.pid

    def current(self, epoch_id: int) -> Optional[Task]:
        """The task of this epoch it is working on, if any."""
        return task_of_epoch(self.outstanding, epoch_id)

    @property
    def pid(self) -> int:
        return self.started.pid

    def describe(self) -> str:
        if self.process is None:
            return f"worker {self.id} (not started yet)"
        return f"worker {self.id} (pid {self.process.pid})"

    def stack_text(self) -> str:
        """Its Python stack, written by the worker on request (a signal; about 50 ms)."""
        if self.stack is None or self.process is None:
            return ""
        return self.stack.request(self.process.pid)


class Fleet:
    """How the workers of one pool are started: what every start needs
    (the start method, their configs, the shared descriptors)."""

    def __init__(self, method: str, make_config: MakeConfig, stop_fd: Optional[int], slot_fds: Sequence[int]):
        self.method = method
        self._make_config = make_config
        self._stop_fd = stop_fd
        #: The pool's list itself: a worker started later gets the files of slots retired meanwhile.
        self._slot_fds = slot_fds

    def start(self, num_workers: int, now: int) -> list[WorkerHandle]:
        """Handles for ``num_workers`` workers, each with its pipes and stack
        file, and the processes of the first ``now`` started (the rest:
        :meth:`start_rest`). Stops what started if anything fails."""
        workers: list[WorkerHandle] = []
        try:
            for wid in range(num_workers):
                channels = Channels()
                try:
                    stack = StackFile()
                except BaseException:
                    channels.close()
                    raise
                workers.append(WorkerHandle(wid, channels, stack))
            for worker in workers[:now]:
                self._launch(worker, workers)
        except BaseException:
            stop_workers(workers)
            raise
        return workers

    def start_rest(self, workers: list[WorkerHandle]) -> list[WorkerHandle]:
        """Start the processes of ``workers`` not started yet, in order; the
        ones started. On a failure the caller stops the pool."""
        started = []
        for worker in workers:
            if worker.process is None:
                self._launch(worker, workers)
                started.append(worker)
        return started

    def _launch(self, worker: WorkerHandle, workers: list[WorkerHandle]) -> None:
        """Start ``worker``'s process. A forked child closes what it must not
        hold: the main process's end of every pipe, and both ends of the
        pipes of workers not started yet (else one worker's end of file
        would wait on another)."""
        stack = worker.stack
        fds = WorkerFds(stop=self._stop_fd, stack=stack.fd if stack else None, slots=tuple(self._slot_fds))
        close_fds = tuple(fd for w in workers for fd in w.channels.main_fds()) + tuple(
            fd for w in workers if w is not worker and w.process is None for fd in w.channels.worker_fds()
        )
        config = self._make_config(worker.id, fds, close_fds)
        payload, payload_fds = pickle_config(config) if self.method == "spawn" else (None, ())
        worker.process = start_worker(self.method, config, payload, worker.channels, payload_fds)
        worker.channels.close_worker_ends()
        deliver_config(self.method, worker.channels, payload)


def stop_workers(workers: list[WorkerHandle]) -> None:
    """1. send Stop (without waiting for room; the caller has raised the shared
    stop flag, so queued tasks are skipped); 2. drain results and wait up to
    ``STOP_GRACE_S``; 3. kill what is left and reap it; 4. close pipes,
    sentinels and stack files. Workers never started only have their pipes
    and stack files closed."""
    started = [w for w in workers if w.process is not None]
    for w in started:  # 1
        try:
            w.channels.tasks.put(pack(Stop()))
        except OSError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S  # 2
    running = [w for w in started if w.started.exitcode is None]
    ended: set[int] = set()  # result pipes that reached their end
    while running and time.monotonic() < deadline:
        poller = select.poll()
        by_fd = {}
        for w in running:
            for fd in (fileno(w.started.sentinel), w.channels.results.fd):
                if fd not in ended:
                    by_fd[fd] = w
                    poller.register(fd, select.POLLIN)
        timeout_ms = max(1, math.ceil((deadline - time.monotonic()) * 1000))
        for fd, _ in poller.poll(timeout_ms):
            w = by_fd[fd]
            if fd == w.channels.results.fd and not w.channels.results.discard():
                ended.add(fd)
        running = [w for w in running if w.started.exitcode is None]
    for w in running:  # 3
        w.started.kill()
    for w in workers:
        if w.process is not None:
            w.process.join(REAP_TIMEOUT_S)
        w.channels.close()  # 4
        if w.process is not None:
            w.process.close()
        if w.stack is not None:
            w.stack.close()
