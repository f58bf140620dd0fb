"""Each stage's seconds per batch: the latest batches' values in columns,
for percentiles, and older ones folded into totals, so memory stays
bounded on runs of any length.

    StatsRecorder._add_pending ──one numpy array per stage──▶ StageColumns.add
                                                            ├─ totals(): exact, over every batch
                                                            └─ stage_stats(): totals and percentiles per stage

Percentiles are over the latest ``WINDOW`` to ``2 × WINDOW`` batches:
once a column holds ``2 × WINDOW`` values, the oldest ``WINDOW`` are
added to the totals and dropped (:meth:`StageColumns.fold`, which the
recorder calls together with the other per-batch records it keeps).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from .figures import STAGES, StageStats

#: Percentiles are computed over at least this many of the latest batches.
WINDOW = 1 << 16


class StageColumns:
    """One column of seconds per stage (in ``STAGES`` order), for the latest batches."""

    def __init__(self) -> None:
        self._columns = tuple(array("d") for _ in STAGES)
        #: Totals of the values folded out of the columns, per stage.
        self._folded = [0.0] * len(STAGES)
        #: Batches folded out so far (the columns' first row is this batch).
        self.rows_folded = 0

    @property
    def rows(self) -> int:
        """Batches added so far, folded or not."""
        return self.rows_folded + len(self._columns[0])

    @property
    def full(self) -> bool:
        """The columns hold ``2 × WINDOW`` batches or more: time to :meth:`fold`."""
        return len(self._columns[0]) >= 2 * WINDOW

    def add(self, values: Sequence[np.ndarray]) -> None:
        """Append one array of seconds per stage (in ``STAGES`` order, all of one length)."""
        for column, stage in zip(self._columns, values):
            column.frombytes(np.ascontiguousarray(stage, dtype=np.float64).tobytes())

    def fold(self) -> None:
        """Keep the latest ``WINDOW`` values of each column; older ones go into the totals."""
        for k, column in enumerate(self._columns):
            self._folded[k] += float(np.frombuffer(column[:WINDOW], dtype=np.float64).sum())
            del column[:WINDOW]
        self.rows_folded += WINDOW

    def arrays(self) -> list[np.ndarray]:
        """A copy of each column, as numpy arrays (safe to read without the recorder's lock)."""
        return [np.frombuffer(column[:], dtype=np.float64) for column in self._columns]

    def totals(self, arrays: Sequence[np.ndarray]) -> list[float]:
        """Each stage's exact total: folded values plus ``arrays`` (those of :meth:`arrays`)."""
        return [folded + float(values.sum()) for folded, values in zip(self._folded, arrays)]


def stage_stats(totals: Sequence[float], arrays: Sequence[np.ndarray]) -> dict[str, StageStats]:
    """Stage name -> StageStats: ``totals`` (per stage, in ``STAGES`` order)
    and percentiles over ``arrays`` (the values per batch, per stage)."""
    stages = {}
    for k, name in enumerate(STAGES):
        values = arrays[k]
        if values.size:
            p50, p90, p99 = (float(v) for v in np.percentile(values, (50, 90, 99)))
        else:
            p50 = p90 = p99 = 0.0
        stages[name] = StageStats(total_s=totals[k], p50_s=p50, p90_s=p90, p99_s=p99)
    return stages
