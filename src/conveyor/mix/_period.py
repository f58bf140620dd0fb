"""One period of a mix: which source each of its ``D`` positions holds,
built so that every prefix is within one sample per source of its share.

Why a table, and not a due time per sample sorted: giving source ``s``'s
``k``-th sample a due time such as ``(k + 1/2) / w_s`` and serving by due
time is a divisor method of apportionment (Webster's); with many sources
its prefixes drift more than one sample from their shares (Balinski and
Young: no divisor method stays within quota; with 5 to 50 random weights
the drift measured 1.4 to 3 samples), and so does a tree of two-way
splits. Staying within one sample needs to know which sources are ahead,
so the period is scheduled once, like this:

    Source ``s`` has ``m_s`` of the ``D`` positions (``_shares.Shares``).
    Its ``k``-th sample (``k = 1..m_s``) is a job that may take position
    ``t`` (1-based: the prefix of length ``t`` ends with it) from its
    release ``floor((k - 1) D / m_s) + 1`` to its deadline
    ``ceil(k D / m_s)``: inside that window, the source's count after
    every prefix ``t`` lies between ``floor(t m_s / D)`` and
    ``ceil(t m_s / D)``, so it is within (strictly) one sample of
    ``t * m_s / D``. Each position takes, of the released jobs, the one
    with the earliest deadline (EDF; ties to the lower source).

EDF meets every deadline of unit jobs with integer windows whenever any
schedule does (the exchange argument), and one does: sequences within one
sample of any shares exist (Tijdeman, "The chairman assignment problem",
1980). The build checks each deadline anyway and would raise rather than
serve a wrong prefix. After ``D`` positions every source has exactly
``m_s``, so the period repeats: position ``p`` of the mix is
``p mod D`` of the table, and its source's count before it is
``(p // D) * m_s`` plus the job's rank in the period. A period costs 6
bytes a position (source, rank), built once per weights in each process
that reads the mix, as far as it reads (the whole of the largest,
``2**20``, in well under a second).
"""

from __future__ import annotations

import heapq
import threading

import numpy as np

from ._shares import Shares

__all__ = ["Period"]


class Period:
    """The scheduled period of ``shares``: ``source[r]`` and ``rank[r]``
    (which of its source's jobs in the period) for each offset ``r``.

    Scheduled lazily, a chunk of offsets at a time, as far as the mix has
    read (:meth:`ensure`): a block of a weights schedule shorter than its
    period costs only its own positions."""

    __slots__ = ("shares", "source", "rank", "built", "_pending", "_served", "_slots", "_lock")

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        n = len(shares.units)
        self.source = np.zeros(shares.period, dtype=np.uint16 if n <= 1 << 16 else np.uint32)
        self.rank = np.zeros(shares.period, dtype=np.uint32)
        #: Offsets scheduled so far: ``source[:built]`` and ``rank[:built]`` hold.
        self.built = 0
        self._pending: list[int] = []
        self._served = [0] * n
        self._slots: dict[int, np.ndarray] = {}
        # (thread workers share the mix: one schedules a chunk at a time)
        self._lock = threading.Lock()

    @property
    def length(self) -> int:
        """``D``, the positions in one period."""
        return self.shares.period

    def ensure(self, offset: int) -> None:
        """Schedule the period up to and including ``offset``."""
        if self.built > offset:
            return
        with self._lock:
            while self.built <= offset:
                self._schedule_chunk(min(self.length, self.built + _CHUNK))

    def slots(self, source: int, upto: int) -> np.ndarray:
        """The offsets of ``source``'s positions among the first ``upto`` (at least) of the period, in order."""
        self.ensure(min(upto, self.length) - 1)
        slots = self._slots.get(source)
        if slots is None or len(slots) < self._served[source]:
            slots = self._slots[source] = np.flatnonzero(self.source[: self.built] == source)
        return slots

    def slot_of(self, source: int, job: int) -> int:
        """The offset of ``source``'s ``job``-th position (0-based) in the period."""
        m = self.shares.units[source]
        deadline = -((-(job + 1) * self.length) // m)  # (the job is scheduled by its deadline)
        return int(self.slots(source, deadline)[job])

    def count(self, source: int, offset: int) -> int:
        """``source``'s positions among the first ``offset`` of the period."""
        return int(np.searchsorted(self.slots(source, offset), offset)) if offset else 0

    def counts(self, offset: int) -> list[int]:
        """Every source's positions among the first ``offset`` of the period."""
        return [self.count(s, offset) if m else 0 for s, m in enumerate(self.shares.units)]

    def _schedule_chunk(self, end: int) -> None:
        """EDF over offsets ``[built, end)`` (positions ``built + 1 .. end``; see the module docstring)."""
        units, period, n = self.shares.units, self.length, len(self.shares.units)
        first, last = self.built + 1, end  # (1-based positions)
        releases, keys = [], []
        for s, m in enumerate(units):
            if m == 0:
                continue
            # Jobs released at positions first..last: those with release floor((k - 1) D / m) + 1 in that range.
            k = np.arange(-((-(first - 1) * m) // period) + 1, -((-last * m) // period) + 1, dtype=np.int64)
            k = k[(k >= 1) & (k <= m)]
            releases.append((k - 1) * period // m + 1)
            keys.append(-((-k * period) // m) * n + s)  # (deadline first, then the lower source; one int sorts fastest)
        release_all, key_all = np.concatenate(releases), np.concatenate(keys)
        order = np.lexsort((key_all, release_all))
        release_list, key_list = release_all[order].tolist(), key_all[order].tolist()
        pending = self._pending
        push, pop = heapq.heappush, heapq.heappop
        chosen = [0] * (last - first + 1)
        j, jobs = 0, len(release_list)
        for t in range(first, last + 1):
            while j < jobs and release_list[j] == t:
                push(pending, key_list[j])
                j += 1
            if not pending:
                raise AssertionError(f"conveyor.Mix: no sample released at position {t} of the period {units}")
            key = pop(pending)
            if key // n < t:
                raise AssertionError(f"conveyor.Mix: a deadline missed at position {t} of the period {units}")
            chosen[t - first] = key % n
        sources = np.asarray(chosen, dtype=np.int64)
        # Each position's rank among its source's: those before this chunk, then its place in the chunk.
        order = np.argsort(sources, kind="stable")
        per_source = np.bincount(sources, minlength=n)
        group_start = np.concatenate(([0], np.cumsum(per_source)[:-1]))
        place = np.empty(len(sources), dtype=np.int64)
        place[order] = np.arange(len(sources)) - np.repeat(group_start, per_source)
        served = np.asarray(self._served, dtype=np.int64)
        self.source[first - 1 : last] = sources
        self.rank[first - 1 : last] = served[sources] + place
        self._served = (served + per_source).tolist()
        self.built = last


#: Offsets scheduled at a time (a chunk costs a few tens of ms).
_CHUNK = 1 << 16
