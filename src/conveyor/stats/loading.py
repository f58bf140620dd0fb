"""The loading threads' own figures, summed: how long they loaded inside
passes (workers busy), and how the measured batches' loading time split
between a CPU, the wait for a free core, and waiting on something else.

    StatsRecorder._add_pending ──LoadTimes columns (numpy)──▶ LoadingTotals.add(columns, floor)
                                                            ├─ busy_s: spans cut at the pass's start
                                                            ├─ cpu_*: figures cut to their batch's span
                                                            └─ spans of the latest batches, for intervals

Each batch's loading span runs from ``started_at`` for fetch + collate +
encode seconds, on the loading thread. A span is cut at its pass's
``iter()`` (``floor``): loading before it belongs to no pass. An interval
(``busy_before``) leaves out what its batches loaded before it began.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping

import numpy as np


class LoadingTotals:
    """Totals over every batch so far; spans of the latest batches (dropped with the recorder's columns)."""

    def __init__(self) -> None:
        #: Seconds the loaders spent loading, inside passes.
        self.busy_s = 0.0
        #: Batches whose CPU figures were measured (and whose wait for a core
        #: was), their loading seconds, and within those the seconds on a CPU
        #: and waiting for a core.
        self.cpu_batches = 0
        self.cpu_wait_batches = 0
        self.cpu_measured_s = 0.0
        self.cpu_s = 0.0
        self.cpu_wait_s = 0.0
        #: Each batch's span after the cut: (from, to), perf_counter readings.
        self._spans = (array("d"), array("d"))

    def add(self, loading: Mapping[str, np.ndarray], floor: float) -> np.ndarray:
        """Add batches delivered in the pass that began at ``floor`` (their
        LoadTimes, one numpy column per field); returns each one's busy
        seconds (its span after the cut)."""
        load = loading["fetch_s"] + loading["collate_s"] + loading["encode_s"]
        started = loading["started_at"]
        span_from, span_to = np.maximum(started, floor), started + load
        self._spans[0].frombytes(span_from.tobytes())
        self._spans[1].frombytes(span_to.tobytes())
        busy = np.maximum(span_to - span_from, 0.0)
        self.busy_s += float(busy.sum())
        cpu, wait = loading["cpu_s"], loading["cpu_wait_s"]
        measured = ~np.isnan(cpu)
        if not measured.any():
            return busy
        load, cpu, wait = load[measured], cpu[measured], wait[measured]
        # Both figures are read inside the span, so these cuts change nothing
        # but a clock that ticks coarsely (Windows) and the in-process loader's
        # last step (its generators put back after collate).
        cpu = np.clip(cpu, 0.0, load)
        has_wait = ~np.isnan(wait)
        wait = np.clip(np.where(has_wait, wait, 0.0), 0.0, load - cpu)
        self.cpu_batches += int(measured.sum())
        self.cpu_wait_batches += int(has_wait.sum())
        self.cpu_measured_s += float(load.sum())
        self.cpu_s += float(cpu.sum())
        self.cpu_wait_s += float(wait.sum())
        return busy

    def busy_before(self, first: int, last: int, at: float) -> np.ndarray:
        """Loading seconds of each of the kept batches ``first:last`` that lay before ``at``."""
        spans_from = np.frombuffer(self._spans[0][first:last], dtype=np.float64)
        spans_to = np.frombuffer(self._spans[1][first:last], dtype=np.float64)
        return np.clip(np.minimum(spans_to, at) - spans_from, 0.0, None)

    def drop_oldest(self, count: int) -> None:
        """Forget the oldest ``count`` spans (the recorder folded their rows)."""
        for column in self._spans:
            del column[:count]
