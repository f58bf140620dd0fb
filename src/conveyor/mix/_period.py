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
that reads the mix (about 0.4 s for the largest, ``2**20``).
"""

from __future__ import annotations

import heapq

import numpy as np

from ._shares import Shares

__all__ = ["Period"]


class Period:
    """The scheduled period of ``shares``: ``source[r]`` and ``rank[r]``
    (which of its source's jobs in the period) for each offset ``r``."""

    __slots__ = ("shares", "source", "rank", "_slots")

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self.source, self.rank = _schedule(shares.units, shares.period)
        self._slots: dict[int, np.ndarray] = {}

    @property
    def length(self) -> int:
        """``D``, the positions in one period."""
        return self.shares.period

    def slots(self, source: int) -> np.ndarray:
        """The offsets of ``source``'s positions in the period, in order."""
        slots = self._slots.get(source)
        if slots is None:
            slots = self._slots[source] = np.flatnonzero(self.source == source)
        return slots

    def count(self, source: int, offset: int) -> int:
        """``source``'s positions among the first ``offset`` of the period."""
        return int(np.searchsorted(self.slots(source), offset))

    def counts(self, offset: int) -> list[int]:
        """Every source's positions among the first ``offset`` of the period."""
        return [self.count(s, offset) if m else 0 for s, m in enumerate(self.shares.units)]


def _schedule(units: tuple[int, ...], period: int) -> tuple[np.ndarray, np.ndarray]:
    """EDF over one period (see the module docstring)."""
    n = len(units)
    releases, keys = [], []
    for s, m in enumerate(units):
        if m == 0:
            continue
        k = np.arange(1, m + 1, dtype=np.int64)
        release = (k - 1) * period // m + 1
        deadline = -((-k * period) // m)
        releases.append(release)
        keys.append(deadline * n + s)  # (deadline first, then the lower source; one int sorts fastest)
    release_all = np.concatenate(releases)
    key_all = np.concatenate(keys)
    order = np.lexsort((key_all, release_all))
    release_list, key_list = release_all[order].tolist(), key_all[order].tolist()
    chosen = [0] * period
    pending: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    j, jobs = 0, len(release_list)
    for t in range(1, period + 1):
        while j < jobs and release_list[j] == t:
            push(pending, key_list[j])
            j += 1
        if not pending:
            raise AssertionError(f"conveyor.Mix: no sample released at position {t} of the period {units}")
        key = pop(pending)
        if key // n < t:
            raise AssertionError(f"conveyor.Mix: a deadline missed at position {t} of the period {units}")
        chosen[t - 1] = key % n
    source = np.asarray(chosen, dtype=np.uint16 if n <= 1 << 16 else np.uint32)
    rank = np.empty(period, dtype=np.int64)
    for s, m in enumerate(units):
        if m:
            rank[source == s] = np.arange(m, dtype=np.int64)
    return source, rank.astype(np.uint32)
