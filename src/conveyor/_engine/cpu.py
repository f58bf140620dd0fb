"""How a loading thread spent its time: running on a core, or runnable and
waiting for one (the rest of its wall time it waited on something else:
storage, the network, a lock, a sleep).

    /proc/thread-self/schedstat ──▶ ThreadClock.used() ──▶ (cpu_s, cpu_wait_s)

Linux reports both per thread in ``schedstat`` (nanoseconds on a CPU,
nanoseconds waiting on a run queue); one ``pread`` of an open descriptor
costs about a microsecond. Elsewhere, or where the kernel keeps no such
figures, ``time.thread_time()`` gives the CPU time and the wait for a core
counts as 0.
"""

from __future__ import annotations

import os
import threading
from time import thread_time
from typing import Optional

_SCHEDSTAT = "/proc/thread-self/schedstat"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the
    system has one; a container's CPU quota is not seen)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadClock:
    """CPU and run-queue seconds of the thread that made it."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self._fd: Optional[int] = None
        try:
            self._fd = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
            self._read()
        except (OSError, ValueError):
            self.close()
        self._cpu, self._waiting = self._read()

    def _read(self) -> tuple[float, float]:
        if self._fd is None:
            return thread_time(), 0.0
        on_cpu, waiting = os.pread(self._fd, 128, 0).split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9

    def used(self) -> tuple[float, float]:
        """(seconds on a CPU, seconds waiting for one) since the previous call."""
        cpu, waiting = self._read()
        used = (cpu - self._cpu, waiting - self._waiting)
        self._cpu, self._waiting = cpu, waiting
        return used

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
