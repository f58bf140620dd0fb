"""The DataLoader's figures: ``stats()``, ``on_stats()`` and ``trace()``,
read off its StatsRecorder (conveyor.stats), which every pass feeds.

    LoaderIterator ──each batch's timings──▶ StatsRecorder ──▶ loader.stats(since)
                                                  ├─ listeners: on_stats(callback, every_s)
                                                  └─ tracer: with loader.trace(path): ...

A loader built with ``collect_stats=False`` has no recorder, and each of
these says so (``_recorder``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Optional, Union

from ..stats import ChromeTrace, LoaderStats, StatsRecorder
from ..stats.live import Periodic
from ..stats.scalars import MetricsWriter, stats_callback

__all__ = ["StatsMethods"]


class StatsMethods:
    """The stats methods of a DataLoader, over its ``_stats`` (None: collect_stats=False)."""

    _stats: Optional[StatsRecorder]

    def stats(self, since: Optional[LoaderStats] = None) -> LoaderStats:
        """Where this loader's time went, over every pass so far (see
        :class:`conveyor.stats.LoaderStats`); with ``since`` (an earlier
        result of this method), ``interval`` holds the stats since then.

        Example::

            >>> from conveyor import DataLoader
            >>> loader = DataLoader(list(range(100)), batch_size=10)
            >>> for batch in loader:
            ...     pass
            >>> stats = loader.stats()
            >>> stats.batches, stats.samples, sorted(stats.stages)[:3]
            (10, 100, ['collate', 'compute', 'fetch'])

        ``stats.summary()`` prints a table and a verdict (input- or
        compute-bound, the slowest stage, what to change).
        """
        return self._recorder().snapshot(since)

    def on_stats(
        self, callback: Union[Callable[[LoaderStats], Any], MetricsWriter], every_s: float = 10.0
    ) -> Callable[[], None]:
        """Call ``callback(loader.stats())`` every ``every_s`` seconds while
        iterating, and at the end of each pass, from the loop's thread (its
        ``interval``: since the previous call). For loggers: a JSON lines
        file (:class:`conveyor.stats.JsonLinesWriter`), or a writer with
        ``add_scalar`` such as TensorBoard's ``SummaryWriter``, given as it
        is (:class:`conveyor.stats.ScalarWriter` says what it writes).
        Returns a function that removes the callback."""
        recorder = self._recorder()
        listener = Periodic(stats_callback(callback), every_s, recorder.snapshot)
        recorder.add_listener(listener)
        return lambda: recorder.remove_listener(listener)

    @contextlib.contextmanager
    def trace(self, path: Union[str, os.PathLike[str]]) -> Iterator[ChromeTrace]:
        """Record every batch's spans (each worker's fetch, collate and
        encode; decode, queue and pin; the loop's waits) while the block
        runs, then write them to ``path`` as Chrome-trace JSON, viewable in
        Perfetto (ui.perfetto.dev) or chrome://tracing."""
        recorder = self._recorder()
        tracer = recorder.tracer = ChromeTrace()
        try:
            yield tracer
        finally:
            recorder.tracer = None
            tracer.write(path)

    def _recorder(self) -> StatsRecorder:
        if self._stats is None:
            raise RuntimeError(
                f"this {type(self).__name__} was built with collect_stats=False; build it with "
                f"collect_stats=True (the default) for stats, callbacks and traces"
            )
        return self._stats
