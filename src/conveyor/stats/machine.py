"""Who used the cores while the loader ran: this job, or other processes.

    begin_pass ──CoreClock.begin(pids)──┐                     ┌──▶ CoreUse(capacity_s, busy_s, job_s)
                                        ├─ pass ─▶ end(pids) ─┤    summed over passes
    snapshot ───CoreClock.totals(pids)──┘                     └──▶ LoaderStats.cores_*_fraction

Three counters, read at the start and end of each pass (never per batch):

* ``busy_s``: CPU seconds every process on the machine used on the cores
  this process may run on (its affinity mask): ``/proc/stat``'s per-core
  lines, user + nice + system + irq + softirq + steal, in clock ticks.
  Steal counts: it is time a hypervisor gave the core to another machine.
* ``job_s``: CPU seconds of this job: the main process (every thread),
  its children already reaped (``getrusage``: self and children), and the
  loader's live worker processes (``/proc/<pid>/stat``: utime + stime).
* ``window_s``: the seconds between the two readings (perf_counter);
  ``capacity_s``: those cores × ``window_s``.

Other processes used ``busy_s - job_s`` of it. Linux only: elsewhere, or
without ``/proc``, nothing is measured and the figures are None.
"""

from __future__ import annotations

import os
from time import perf_counter
from typing import Iterable, NamedTuple, Optional

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

_PROC_STAT = "/proc/stat"
#: Enough of /proc/stat for the per-core lines of a machine of a few thousand cores.
_PROC_STAT_BYTES = 1 << 18
#: Fields of a ``/proc/stat`` core line that are busy time: user, nice,
#: system, irq, softirq, steal (idle and iowait are not; guest time is
#: already inside user and nice).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


class CoreUse(NamedTuple):
    """CPU seconds on the usable cores over some wall time (see the module docstring)."""

    window_s: float = 0.0
    capacity_s: float = 0.0
    busy_s: float = 0.0
    job_s: float = 0.0

    def plus(self, other: "CoreUse") -> "CoreUse":
        return CoreUse(*(a + b for a, b in zip(self, other)))

    def minus(self, other: "CoreUse") -> "CoreUse":
        return CoreUse(*(a - b for a, b in zip(self, other)))


class _Reading(NamedTuple):
    at: float
    cores: int
    busy_s: float
    job_s: float


class CoreClock:
    """Sums :class:`CoreUse` over the passes of one loader."""

    def __init__(self) -> None:
        self._tick_s = _tick_s()
        self._cpus = _usable_cpus()
        self._start: Optional[_Reading] = None
        self.total = CoreUse()
        #: False once a reading failed: this system does not report the figures.
        self.measured = self._tick_s is not None and self._cpus is not None and resource is not None

    def begin(self, worker_pids: Iterable[int]) -> None:
        """A pass starts now; ``worker_pids``: the loader's workers known so far."""
        self._start = self._read(worker_pids)

    def end(self, worker_pids: Iterable[int]) -> None:
        """The pass ended now: add its CoreUse to the total."""
        self.total = self.total.plus(self._open_pass(worker_pids))
        self._start = None

    def totals(self, worker_pids: Iterable[int]) -> Optional[CoreUse]:
        """Every pass so far, the open one up to now; None where not measured."""
        if not self.measured:
            return None
        return self.total.plus(self._open_pass(worker_pids))

    def _open_pass(self, worker_pids: Iterable[int]) -> CoreUse:
        if self._start is None:
            return CoreUse()
        now = self._read(worker_pids)
        if now is None or self._start is None:
            return CoreUse()
        start = self._start
        return CoreUse(
            window_s=now.at - start.at,
            capacity_s=(now.at - start.at) * now.cores,
            busy_s=max(0.0, now.busy_s - start.busy_s),
            job_s=max(0.0, now.job_s - start.job_s),
        )

    def _read(self, worker_pids: Iterable[int]) -> Optional[_Reading]:
        cpus, tick_s = self._cpus, self._tick_s
        if not self.measured or cpus is None or tick_s is None:  # (measured: both known)
            return None
        try:
            busy = _cores_busy_s(cpus, tick_s)
            job = _own_cpu_s() + _workers_cpu_s(worker_pids, tick_s)
        except Exception:  # (best effort: also at interpreter exit, from a finalizer)
            self.measured = False
            return None
        return _Reading(perf_counter(), len(cpus), busy, job)


def _workers_cpu_s(worker_pids: Iterable[int], tick_s: float) -> float:
    """CPU seconds of the live workers. A worker that exited and was
    reaped is gone from /proc, and its time is in the children's
    (``getrusage``); one that was never read counts from 0 (it started
    during the pass, or its time before is the job's anyway)."""
    total = 0.0
    own = os.getpid()
    for pid in worker_pids:
        if pid <= 0 or pid == own:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # After the name: state is field 3, utime 14 and stime 15 (proc(5)).
        total += (int(fields[11]) + int(fields[12])) * tick_s
    return total


def _tick_s() -> Optional[float]:
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None


def _usable_cpus() -> Optional[frozenset]:
    if not os.path.exists(_PROC_STAT):
        return None
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cores_busy_s(cpus: frozenset, tick_s: float) -> float:
    """Busy seconds of ``cpus`` since boot. One read: the kernel writes the
    whole file at once, the per-core lines first (tens of microseconds in all)."""
    # (a file object, not a bare descriptor: one a signal handler's exception
    # interrupts between the opening and the read is closed as it is let go)
    with open(_PROC_STAT, "rb", buffering=0) as stat:
        data = stat.read(_PROC_STAT_BYTES)
    busy = 0
    for line in data.split(b"\n", (os.cpu_count() or 1) + 1):
        if not line.startswith(b"cpu"):
            break
        name, *fields = line.split()
        if name != b"cpu" and int(name[3:]) in cpus:
            busy += sum(int(fields[k]) for k in _BUSY_FIELDS)
    return busy * tick_s


def _own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
