"""The loader's stats recorder: one call per batch, totals and recent values per stage.

    LoaderIterator.__next__ ──batch(Delivered, called_at, returned_at)──▶ StatsRecorder
                                                                        ├─▶ listeners when due (bar, callbacks)
                                                                        ├─▶ tracer (while tracing)
                            loader.stats() ──snapshot()──────────────▶ LoaderStats (report.py)

The per-batch path appends one row to a list, without a lock (see
:meth:`StatsRecorder.batch`; ``loader.stats()`` may be called from another
thread, a logger's say); rows go into one column per stage in bulk
(columns.py). Totals are exact for the whole life of the loader;
percentiles are over the most recent ``WINDOW`` to ``2 × WINDOW`` batches
(older values are folded into the totals), so memory stays bounded on runs
of any length.

Loading time counts toward "workers busy" only inside the passes (a
batch's loading span is cut at its pass's ``iter()``), and an interval
(``stats(since=...)``, the bar's half second) leaves out the part of its
batches' spans that lay before it began: a batch loaded ahead and
delivered later is busy time of when it was loaded (loading.py). The same
totals are kept per worker and per node, by the worker ids and pid each
batch's record carries (workers.py).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional, Protocol

import numpy as np

from .._engine.executor.records import DeliveryTimes
from .._engine.interrupts import HolderLock
from .._engine.transport.messages import LoadTimes
from .columns import WINDOW, StageColumns, stage_stats
from .figures import STAGES, Mark
from .loading import LoadingTotals
from .machine import CoreClock, CoreUse
from .report import LoaderStats
from .workers import WorkerTotals

#: Rows are added to the columns this many at a time (one numpy conversion
#: instead of a dozen Python-level appends per batch).
BULK = 256
#: The numpy type of each field of Timings' two parts, read as columns many rows at once.
_LOADING = {name: np.int64 if name == "samples" else np.float64 for name in LoadTimes._fields}
_DELIVERY = {
    name: np.int64 if name in ("worker_id", "worker_pid", "slots_in_use") else np.float64
    for name in DeliveryTimes._fields
}


def _columns(rows: list, types: dict[str, Any]) -> dict[str, np.ndarray]:
    """Named-tuple ``rows`` (all of one type, whose fields ``types`` lists
    in order) as one numpy column per field."""
    return {name: np.array(column, dtype=kind) for (name, kind), column in zip(types.items(), zip(*rows))}


class Listener(Protocol):
    """Something told about a pass as it goes (the bar, a callback)."""

    def begin_pass(self, recorder: "StatsRecorder", total: Optional[int]) -> None: ...

    def due_at(self) -> float:
        """When it next wants :meth:`tick` (a perf_counter reading)."""

    def tick(self, recorder: "StatsRecorder", now: float) -> None: ...

    def end_pass(self, recorder: "StatsRecorder") -> None: ...


class StatsRecorder:
    """Records every batch a loader delivers; makes :class:`LoaderStats`."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.worker_method = ""
        # Re-entrant: a finalizer run by the garbage collector in the middle
        # of a recording (an old iterator collected) may call abandon_pass.
        # A reading there, or from a signal handler, gets the latest snapshot.
        self._lock = HolderLock()
        self._latest: Optional[LoaderStats] = None
        #: The pass being recorded; batches of an older iterator still running are not.
        self._pass_id = 0
        #: Samples skip_bad_samples left out (skips.SkippedSample), in order.
        self._skipped: list = []
        #: Each stage's seconds: the latest batches' per batch, older ones' totals.
        self._stages = StageColumns()
        #: Batches not yet in the columns: their Timings' two parts, the
        #: loop's wait and compute (appended in this order).
        self._pending: tuple[list[LoadTimes], list[DeliveryTimes], list[float], list[float]] = ([], [], [], [])
        self.batches = 0
        self.samples = 0
        self.errors = 0
        self.passes = 0
        #: The loaders' (workers', or the main process's) own figures.
        self._loading = LoadingTotals()
        #: The same per worker and node (workers.py).
        self._workers = WorkerTotals()
        #: When the latest pass began (loading before it is not this pass's).
        self._floor = float("-inf")
        #: The workers' pids seen so far, and who used the cores during passes.
        self._worker_pids: set[int] = set()
        self._cores = CoreClock()
        #: Waits of the loop that belong to no batch (starting workers in iter(),
        #: the last next(), batches that raised), and such compute time.
        self._extra_wait_s = 0.0
        self._extra_compute_s = 0.0
        self._wall_closed_s = 0.0
        self._pass_started: Optional[float] = None
        #: When the latest next() returned (or the pass began).
        self._last_event = 0.0
        self._first_batch_pending = False
        self.first_batch_s: Optional[float] = None
        self._startup_s = 0.0
        self.worker_start_s: Optional[float] = None
        #: How many times workers were started (once per pass, unless they persist).
        self.worker_starts = 0
        self.slots_in_use = 0
        self._listeners: list[Listener] = []
        self._due = float("inf")
        self.tracer: Optional[Any] = None
        #: The latest pass's count of a Mix's sources (mix/_tally.py; None: not a Mix).
        self.mix: Optional[Any] = None

    def __reduce__(self) -> tuple[Callable[[int, list[Listener]], StatsRecorder], tuple[int, list[Listener]]]:
        """A pickled loader starts its stats afresh; the progress bar comes
        along (``carried`` listeners), callbacks and traces do not."""
        carried = [listener for listener in self._listeners if getattr(listener, "carried", False)]
        return (_fresh_recorder, (self.num_workers, carried))

    # ----------------------------------------------------------- listeners
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)
        self._due = min(self._due, listener.due_at())

    def remove_listener(self, listener: Listener) -> None:
        """Stop telling ``listener``; nothing if it was removed already."""
        if listener in self._listeners:
            self._listeners.remove(listener)
        self._due = min((each.due_at() for each in self._listeners), default=float("inf"))

    # ----------------------------------------------------------- recording
    def begin_pass(self, started_at: float, total: Optional[int], num_workers: int, worker_method: str = "") -> int:
        """A pass began at ``started_at`` (when iter() was called); its
        iterator is ready now. The time in between (starting workers, say)
        is time the loop waited for data. ``worker_method``: where its
        workers run (plan.Running.method). Returns the pass's id, which the
        other calls take."""
        with self._lock:
            self._close_pass()
            self._cores.begin(self._worker_pids)
            now = perf_counter()
            self._floor = started_at
            self.num_workers = num_workers
            self.worker_method = worker_method
            self.passes += 1
            self._pass_id += 1
            pass_id = self._pass_id
            self._pass_started = started_at
            self._extra_wait_s += now - started_at
            self._last_event = now
            self._first_batch_pending = True
        for listener in self._listeners:
            listener.begin_pass(self, total)
        self._due = min((each.due_at() for each in self._listeners), default=float("inf"))
        return pass_id

    def skipped(self, records: tuple) -> None:
        """Samples left out of a batch (skips.SkippedSample records)."""
        with self._lock:
            self._skipped.extend(records)

    def batch(self, pass_id: int, delivered: Any, called_at: float, returned_at: float) -> None:
        """``next()`` was called at ``called_at`` and returned ``delivered``
        (an executor's Delivered) at ``returned_at``.

        The hot path appends one row to ``_pending`` and takes no lock (an
        append is one call under the GIL); every ``BULK`` batches, or when
        the stats are read, the pending rows go into the columns at once
        (:meth:`_add_pending`, under the lock)."""
        if pass_id != self._pass_id:
            return
        timings = delivered.timings
        self.batches += 1
        if timings is None:  # a batch that raised: its time counts, not as a stage
            self.errors += 1
            self._extra_wait_s += returned_at - called_at
            self._extra_compute_s += called_at - self._last_event
        else:
            loading, delivery, waits, computes = self._pending
            loading.append(timings[0])
            delivery.append(timings[1])
            waits.append(returned_at - called_at)
            computes.append(called_at - self._last_event)
        self._last_event = returned_at
        if self._first_batch_pending:
            assert self._pass_started is not None  # (begin_pass sets both)
            self._first_batch_pending = False
            self.first_batch_s = returned_at - self._pass_started
            self._startup_s += self.first_batch_s
        if len(self._pending[3]) >= BULK:
            with self._lock:
                self._add_pending()
        if self.tracer is not None:
            self.tracer.batch(delivered, called_at, returned_at)
        if returned_at >= self._due:
            self._tick(returned_at)

    def _add_pending(self) -> None:
        """Move the pending batches into the columns and totals (under the lock).

        Only this method removes entries, and only from the front, while the
        loop's thread appends at the end, the last list last: counting the
        last list, every list has at least that many entries."""
        pending = self._pending
        count = len(pending[3])
        if not count:
            return
        loading_rows, delivery_rows = pending[0][:count], pending[1][:count]
        waits, computes = pending[2][:count], pending[3][:count]
        for part in pending:
            del part[:count]
        loading = _columns(loading_rows, _LOADING)
        delivery = _columns(delivery_rows, _DELIVERY)
        self.samples += int(loading["samples"].sum())
        busy = self._loading.add(loading, self._floor)
        self._workers.add(delivery["worker_id"], delivery["worker_pid"], loading["samples"], busy)
        self._worker_pids.update(np.unique(delivery["worker_pid"]).tolist())
        self.slots_in_use = int(delivery["slots_in_use"][-1])
        ready = delivery["workers_ready_s"][~np.isnan(delivery["workers_ready_s"])]
        if ready.size:
            self.worker_start_s = float(ready[-1])
            self.worker_starts += int(ready.size)
        values = (
            delivery["sampler_s"],
            loading["fetch_s"],
            loading["collate_s"],
            loading["encode_s"] + delivery["decode_s"],
            delivery["queue_s"],
            delivery["pin_s"],
            np.array(waits, dtype=np.float64),
            np.array(computes, dtype=np.float64),
        )
        self._stages.add(values)
        if self._stages.full:
            self._fold()

    def end_pass(self, pass_id: int, called_at: float, ended_at: float) -> None:
        """The pass ended: the last ``next()``, called at ``called_at``, found no more batches."""
        with self._lock:
            if pass_id != self._pass_id or self._pass_started is None:
                return
            self._extra_wait_s += ended_at - called_at
            self._extra_compute_s += called_at - self._last_event
            self._last_event = ended_at
            self._close_pass()
        for listener in self._listeners:
            listener.end_pass(self)

    def abandon_pass(self, pass_id: int) -> None:
        """The pass was left before its end (break, an error, the iterator
        collected); nothing when it ended already or another began."""
        with self._lock:
            was_open = pass_id == self._pass_id and self._pass_started is not None
            if was_open:
                self._close_pass()
        if was_open:
            for listener in self._listeners:
                listener.end_pass(self)

    def _close_pass(self) -> None:
        """End the open pass (under the lock): its batches are added (cut at
        its start, their workers known), its wall time and core use too."""
        if self._pass_started is not None:
            self._add_pending()
            self._wall_closed_s += self._last_event - self._pass_started
            self._pass_started = None
            self._cores.end(self._worker_pids)

    def _fold(self) -> None:
        """Keep the latest WINDOW batches' values; older ones go into the totals."""
        self._stages.fold()
        self._loading.drop_oldest(WINDOW)
        self._workers.drop_oldest(WINDOW)

    def _tick(self, now: float) -> None:
        for listener in list(self._listeners):
            if now >= listener.due_at():
                listener.tick(self, now)
        self._due = min((each.due_at() for each in self._listeners), default=float("inf"))

    # ----------------------------------------------------------- reading
    def mark(self) -> Mark:
        """The running totals now, without percentiles or core use: cheap enough for a bar."""
        with self._lock:
            self._add_pending()
            return self._mark_locked(self._stages.totals(self._stages.arrays()))

    def interval(self, now: Mark, earlier: Mark) -> Mark:
        """``now`` less ``earlier`` (two marks of this recorder, ``earlier``
        first), the loading done before ``earlier`` left out of ``busy_s`` (and of each worker's)."""
        with self._lock:
            return self._interval_locked(now, earlier)

    def _interval_locked(self, now: Mark, earlier: Mark) -> Mark:
        """Batches delivered after ``earlier`` may have been loaded, in part,
        before it (ahead of the loop): that part is not the interval's. The
        cut needs each batch's span; past ``WINDOW`` batches the oldest
        spans are gone, and a long interval's first batches count whole."""
        first, last = (max(0, mark.rows - self._stages.rows_folded) for mark in (earlier, now))
        before = self._loading.busy_before(first, last, earlier.at)
        interval = now.minus(earlier)
        workers = interval.workers.less_busy(self._workers.busy_each(first, last, before))
        return interval._replace(busy_s=max(0.0, interval.busy_s - float(before.sum())), workers=workers)

    def _mark_locked(self, stage_totals: list[float], cores: Optional[CoreUse] = None) -> Mark:
        """The running totals now; ``stage_totals``: the columns' (StageColumns.totals)."""
        wall_s = self._wall_closed_s
        if self._pass_started is not None:
            wall_s += self._last_event - self._pass_started
        stage_totals = list(stage_totals)
        stage_totals[_WAIT] += self._extra_wait_s
        stage_totals[_COMPUTE] += self._extra_compute_s
        return Mark(
            rows=self._stages.rows,
            batches=self.batches,
            samples=self.samples,
            errors=self.errors,
            wall_s=wall_s,
            at=self._last_event,
            busy_s=self._loading.busy_s,
            cpu_batches=self._loading.cpu_batches,
            cpu_wait_batches=self._loading.cpu_wait_batches,
            cpu_measured_s=self._loading.cpu_measured_s,
            cpu_s=self._loading.cpu_s,
            cpu_wait_s=self._loading.cpu_wait_s,
            startup_s=self._startup_s,
            stage_totals=tuple(stage_totals),
            cores=cores,
            workers=self._workers.mark(),
        )

    def snapshot(self, since: Optional[LoaderStats] = None) -> LoaderStats:
        """The stats now; ``interval`` holds those since ``since`` (an
        earlier snapshot of this loader), when given. From a signal
        handler (or a finalizer) that interrupted a change of the figures in
        this thread: the latest snapshot, as the figures were before it."""
        if self._lock.held_here() and self._latest is not None:
            return self._latest
        with self._lock:
            self._add_pending()
            columns = self._stages.arrays()
            mark = self._mark_locked(self._stages.totals(columns), self._cores.totals(self._worker_pids))
            rows_folded = self._stages.rows_folded
            since_mark = since._mark if since is not None else None
            interval_mark = self._interval_locked(mark, since_mark) if since_mark is not None else None
            extras = dict(
                num_workers=self.num_workers,
                worker_method=self.worker_method,
                passes=self.passes,
                first_batch_s=self.first_batch_s,
                worker_start_s=self.worker_start_s,
                worker_starts=self.worker_starts,
                slots_in_use=self.slots_in_use,
                skipped=tuple(self._skipped),
                mix=self.mix.report() if self.mix is not None else None,
            )
        stats = self._latest = _stats_from(mark, columns, extras, self.num_workers)
        if since_mark is None or interval_mark is None:  # (both or neither)
            return stats
        start = max(0, since_mark.rows - rows_folded)
        interval = _stats_from(interval_mark, [c[start:] for c in columns], extras, self.num_workers)
        return stats.with_interval(interval)


def _fresh_recorder(num_workers: int, listeners: list) -> StatsRecorder:
    recorder = StatsRecorder(num_workers)
    for listener in listeners:
        recorder.add_listener(listener)
    return recorder


def _stats_from(mark: Mark, columns: list[np.ndarray], extras: dict, num_workers: int) -> LoaderStats:
    return LoaderStats.from_mark(mark, stage_stats(mark.stage_totals, columns), **extras)


_WAIT = STAGES.index("wait")
_COMPUTE = STAGES.index("compute")
