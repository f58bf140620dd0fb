"""The mix's order: position ``p`` -> (source, count of that source before
``p``), a pure function of the weights and the position.

    block b = blocks.block_at(p); a = the first block of b's run of equal weights
    q = p - start(a), period = the block's Period (D positions)
    source  = period.source[q mod D]
    count   = start_counts(a)[source] + (q // D) * m_source + period.rank[q mod D]

``start_counts(b)``, each source's count at block ``b``'s first position,
is computed once per block from the block before it and kept: so counts
carry over a change of weights, and no source's sample is repeated or
skipped across it. A period runs on across blocks of equal weights (a
function schedule read every N positions that returns the same weights).
Periods are built once per weights in a process, as far as read, and kept
(the latest few).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

import numpy as np

from ._period import Period
from ._schedule import Blocks
from ._shares import Shares

__all__ = ["MixOrder"]

#: Periods kept per process (each up to 6 MiB); a schedule that returns to
#: earlier weights finds them here.
_PERIODS_KEPT = 8
#: Blocks walked to find where a source of a function schedule runs out,
#: before giving up and asking for num_samples=.
_MAX_BLOCKS_WALKED = 1 << 20


class MixOrder:
    """Which source and which of its samples each position holds."""

    def __init__(self, blocks: Blocks, sources: int) -> None:
        self.blocks = blocks
        self.sources = sources
        self._start_counts: list[np.ndarray] = [np.zeros(sources, dtype=np.int64)]
        self._periods: OrderedDict[Shares, Period] = OrderedDict()
        # (thread workers share the mix: the lazy caches grow under it)
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, object]:
        # Pickled to workers without its periods (each process builds those it reads).
        return {"blocks": self.blocks, "sources": self.sources, "_start_counts": self._start_counts[:1]}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._periods = OrderedDict()
        self._lock = threading.RLock()

    def period(self, block: int) -> Period:
        """``block``'s scheduled period (built on first use)."""
        shares = self.blocks.shares(block)
        with self._lock:
            period = self._periods.get(shares)
            if period is None:
                period = self._periods[shares] = Period(shares)
                while len(self._periods) > _PERIODS_KEPT:
                    self._periods.popitem(last=False)
            else:
                self._periods.move_to_end(shares)
        return period

    def start_counts(self, block: int) -> np.ndarray:
        """Each source's count before ``block``'s first position."""
        if block >= len(self._start_counts):
            with self._lock:
                while len(self._start_counts) <= block:
                    b = len(self._start_counts) - 1
                    end = self.blocks.end(b)
                    assert end is not None  # (only the last block has no end)
                    self._start_counts.append(self._counts_in(b, end))
        return self._start_counts[block]

    def _anchor(self, block: int) -> tuple[int, np.ndarray]:
        """Where ``block``'s period started (the first block of its run of
        equal weights) and each source's count there."""
        run = self.blocks.run_of(block)
        return self.blocks.start(run), self.start_counts(run)

    def _counts_in(self, block: int, position: int) -> np.ndarray:
        """Each source's count before ``position``, which is in ``block`` (or its end)."""
        start, before = self._anchor(block)
        period = self.period(block)
        whole, offset = divmod(position - start, period.length)
        units = np.asarray(period.shares.units, dtype=np.int64)
        return before + whole * units + np.asarray(period.counts(offset), dtype=np.int64)

    def counts(self, position: int) -> np.ndarray:
        """Each source's count among positions ``[0, position)``."""
        return self._counts_in(self.blocks.block_at(position), position)

    def target(self, position: int) -> np.ndarray:
        """Each source's target count over ``[0, position)``: the sum of
        each block's share times its positions there (floats)."""
        total = np.zeros(self.sources)
        block = self.blocks.block_at(position)
        for b in range(block + 1):
            end = self.blocks.end(b)
            end = position if b == block or end is None else end
            shares = self.blocks.shares(b)
            total += (end - self.blocks.start(b)) * np.asarray(shares.units, dtype=np.float64) / shares.period
        return total

    def locate(self, position: int) -> tuple[int, int]:
        """(source, that source's count before ``position``)."""
        block = self.blocks.block_at(position)
        start, before = self._anchor(block)
        period = self.period(block)
        whole, offset = divmod(position - start, period.length)
        period.ensure(offset)
        source = int(period.source[offset])
        count = int(before[source]) + whole * period.shares.units[source] + int(period.rank[offset])
        return source, count

    def locate_many(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` of each of ``positions`` (int64), as two int64 arrays."""
        sources = np.empty(len(positions), dtype=np.int64)
        counts = np.empty(len(positions), dtype=np.int64)
        if not len(positions):
            return sources, counts
        if self.blocks.kind == "constant":
            groups = [(0, np.arange(len(positions)))]
        else:
            at = self.blocks.blocks_at(positions)
            groups = [(int(b), np.flatnonzero(at == b)) for b in np.unique(at)]
        for block, where in groups:
            period = self.period(block)
            start, before = self._anchor(block)
            whole, offset = np.divmod(positions[where] - start, period.length)
            period.ensure(int(offset.max()))
            source = period.source[offset].astype(np.int64)
            units = np.asarray(period.shares.units, dtype=np.int64)
            sources[where] = source
            counts[where] = before[source] + whole * units[source] + period.rank[offset]
        return sources, counts

    def reaches(self, source: int, count: int) -> Optional[int]:
        """The shortest prefix in which ``source`` has ``count`` samples;
        None when it never has (its weight stays 0)."""
        return self.first_reached({source: count})

    def first_reached(self, counts: dict[int, int]) -> Optional[int]:
        """The shortest prefix in which one of the sources ``counts`` names
        has that many samples (a ``stop="first"`` mix's length); None when
        none ever has. Blocks are walked once for all of them, so a source
        never read does not hold up those that run out."""
        block = 0
        for _ in range(_MAX_BLOCKS_WALKED):
            start_counts = self.start_counts(block)
            if any(int(start_counts[s]) >= count for s, count in counts.items()):
                return self.blocks.start(block)
            end = self.blocks.end(block)
            prefixes = [self._reached_in(block, s, count) for s, count in counts.items()]
            within = [prefix for prefix in prefixes if prefix is not None and (end is None or prefix <= end)]
            if within:
                return min(within)
            if end is None:
                return None
            block += 1
        raise ValueError(
            f"Mix: the weights' schedule ran {_MAX_BLOCKS_WALKED} blocks without a source running out; give "
            f"num_samples= (the mix's length)"
        )

    def _reached_in(self, block: int, source: int, count: int) -> Optional[int]:
        """The prefix in which ``source`` has ``count`` samples were
        ``block``'s weights kept from its run's start on (None: its weight there is 0)."""
        period = self.period(block)
        units = period.shares.units[source]
        if not units:
            return None
        start, counts = self._anchor(block)
        whole, within = divmod(count - int(counts[source]) - 1, units)
        return start + whole * period.length + period.slot_of(source, within) + 1
