"""How a loading thread spent one batch's loading time: running on a core,
or runnable and waiting for one (the rest of that time it waited on
something else: storage, the network, a lock, a sleep).

    StageClock() ─▶ ThreadClock.begin(started_at) ─▶ fetch, collate, encode ─▶ ThreadClock.end() ─▶ (cpu_s, cpu_wait_s)
                        reads both counters                                        reads them again

Both readings are taken by the loading thread itself, inside the batch's
loading span (after ``started_at``, before the span's end is read), so the
two figures cover part of that span and never more:
``cpu_s + cpu_wait_s <= loading time`` up to the clocks' resolution.

* CPU seconds: ``time.thread_time()`` (``CLOCK_THREAD_CPUTIME_ID`` on
  Linux: exact to the nanosecond; on Windows it advances in clock ticks).
* Seconds waiting for a core: the second field of
  ``/proc/thread-self/schedstat`` (Linux: nanoseconds this thread spent
  runnable on a run queue; the kernel adds each wait when the thread gets
  its core back, so the figure read by the running thread is exact).
  Elsewhere it is not measured: NaN.

Reading both costs about 3 µs, so a thread measures a batch only when it
starts at least ``MEASURE_EVERY_S`` after the last measured batch started:
when batches take that long or longer, every batch is measured; shorter
ones are sampled, and the cost stays under 0.5% of the thread's time. A
batch not measured reports NaN.
"""

from __future__ import annotations

import math
import os
import threading
from time import thread_time
from typing import Optional

_SCHEDSTAT = "/proc/thread-self/schedstat"
#: Measure a batch that starts this long after the last measured one started
#: (about 3 µs a measurement: at most 0.3% of a loading thread's time).
MEASURE_EVERY_S = 0.001
#: What a batch that was not measured reports (for either figure).
NOT_MEASURED = math.nan


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the
    system has one; a container's CPU quota is not seen)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadClock:
    """CPU and run-queue seconds of the thread that made it, over the spans
    between :meth:`begin` and :meth:`end` (one batch's loading each)."""

    def __init__(self, every_s: float = MEASURE_EVERY_S) -> None:
        self.thread = threading.get_ident()
        self._every_s = every_s
        self._due = 0.0
        self._measuring = False
        self._cpu = self._waiting = 0.0
        self._fd: Optional[int] = None
        try:
            self._fd = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
            self._run_queue_s()
        except (OSError, ValueError):
            self.close()

    def _run_queue_s(self) -> float:
        if self._fd is None:
            return NOT_MEASURED
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9

    def begin(self, started_at: float) -> None:
        """A batch's loading began at ``started_at`` (a perf_counter
        reading, taken before this call); measure it if one is due."""
        self._measuring = started_at >= self._due
        if self._measuring:
            self._due = started_at + self._every_s
            self._cpu = thread_time()
            self._waiting = self._run_queue_s()

    def end(self) -> tuple[float, float]:
        """(seconds on a CPU, seconds waiting for one) since :meth:`begin`;
        NaN for a batch not measured, and for the wait where the system
        does not report it. Call it before reading the span's end."""
        if not self._measuring:
            return NOT_MEASURED, NOT_MEASURED
        self._measuring = False
        waiting = self._run_queue_s() - self._waiting
        cpu = thread_time() - self._cpu
        return cpu, waiting

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
