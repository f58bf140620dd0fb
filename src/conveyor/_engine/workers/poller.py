"""One wait over every worker process: its result pipe, its end, and its
task pipe while bytes wait for room.

    Poller.watch(worker)  ──▶ its result pipe (RESULT), its sentinel (EXIT)
    Poller.want_room      ──▶ its task pipe (WRITABLE) while a frame waits to be written
    Poller.wait(timeout)  ──▶ (worker, Event) for each ready descriptor

One ``poll`` object is kept from wait to wait: building a selector per
wait, as ``multiprocessing.connection.wait`` does, costs more than a small batch.
"""

from __future__ import annotations

import enum
import math
import select
from typing import Any, Optional


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
        self._by_fd: dict[int, tuple[Any, Event]] = {}

    @property
    def watched(self) -> bool:
        return any(event is not Event.WRITABLE for _, event in self._by_fd.values())

    def _register(self, fd: int, worker: Any, event: Event) -> None:
        self._poll.register(fd, select.POLLOUT if event is Event.WRITABLE else select.POLLIN)
        self._by_fd[fd] = (worker, event)

    def _unregister(self, fd: int) -> None:
        if self._by_fd.pop(fd, None) is not None:
            self._poll.unregister(fd)

    def watch(self, worker: Any) -> None:
        self._register(worker.channels.results.fd, worker, Event.RESULT)
        self._register(fileno(worker.process.sentinel), worker, Event.EXIT)
        self.want_room(worker)

    def want_room(self, worker: Any) -> None:
        """Watch its task pipe for room while bytes wait to be written."""
        fd = worker.channels.tasks.fd
        if worker.channels.tasks.pending and not worker.exited:
            if fd not in self._by_fd:
                self._register(fd, worker, Event.WRITABLE)
        else:
            self._unregister(fd)

    def forget_results(self, worker: Any) -> None:
        """Its result pipe reached its end: stop polling it (it would stay readable)."""
        self._unregister(worker.channels.results.fd)

    def forget(self, worker: Any) -> None:
        for fd, (owner, _) in list(self._by_fd.items()):
            if owner is worker:
                self._unregister(fd)

    def wait(self, timeout_s: Optional[float]) -> list[tuple[Any, Event]]:
        """(worker, event) for each ready descriptor; [] at the timeout."""
        timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout_ms) if fd in self._by_fd]


def fileno(handle: Any) -> int:
    """A descriptor number, from a number or an object with fileno()."""
    return handle if isinstance(handle, int) else handle.fileno()
