"""Live views of a running loader: a terminal bar and periodic callbacks.

    StatsRecorder ──tick when due──▶ ProgressBar (tqdm: samples/s, data wait, workers busy, ETA)
                                 └─▶ Periodic(callback, every_s) ──▶ callback(LoaderStats)
                                                                     e.g. JsonLinesWriter(path)

Listeners run in the training loop's thread, inside ``next()``, at most once
per period each; nothing is printed unless asked for.
"""

from __future__ import annotations

import json
import os
import time
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO, Union, cast

from .figures import STAGES, Mark, fractions, share_of
from .report import LoaderStats

if TYPE_CHECKING:
    from .recorder import StatsRecorder

#: How often the bar's numbers are brought up to date.
BAR_EVERY_S = 0.5


class ProgressBar:
    """A tqdm bar per pass: batches with ETA, and samples/s, data wait and
    workers busy over the last half second. Needs ``tqdm`` (``pip install tqdm``)."""

    #: A pickled loader keeps its bar (see StatsRecorder.__reduce__).
    carried = True

    def __init__(self, every_s: float = BAR_EVERY_S, **tqdm_kwargs: Any):
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:
            raise ImportError(
                "progress=True needs tqdm, which is not installed: pip install tqdm (or conveyor[progress])"
            ) from exc
        self._tqdm = tqdm
        self._kwargs = {"unit": "batch", "desc": "conveyor", "dynamic_ncols": True, **tqdm_kwargs}
        self._every_s = every_s
        self._bar: Any = None
        self._due = float("inf")
        self._last: Optional[Mark] = None
        self._batches_before = 0

    def __reduce__(self) -> tuple[type[ProgressBar], tuple[float], dict[str, Any]]:
        return (type(self), (self._every_s,), {"_kwargs": self._kwargs})

    def begin_pass(self, recorder: StatsRecorder, total: Optional[int]) -> None:
        self._close()
        self._bar = self._tqdm(total=total, **self._kwargs)
        self._due = perf_counter() + self._every_s
        self._last = recorder.mark()
        self._batches_before = recorder.batches

    def due_at(self) -> float:
        return self._due

    def tick(self, recorder: StatsRecorder, now: float) -> None:
        self._due = now + self._every_s
        if self._bar is not None:
            self._bring_up_to_date(recorder)
            self._bar.refresh()

    def _bring_up_to_date(self, recorder: StatsRecorder) -> None:
        mark = recorder.mark()
        self._bar.n = mark.batches - self._batches_before
        recent = recorder.interval(mark, self._last) if self._last is not None else mark
        self._bar.set_postfix_str(_postfix(recent, recorder.num_workers), refresh=False)
        self._last = mark

    def end_pass(self, recorder: StatsRecorder) -> None:
        if self._bar is not None:
            self._bring_up_to_date(recorder)  # (closing draws it once more, with these numbers)
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._due = float("inf")


def _postfix(recent: Mark, num_workers: int) -> str:
    """The bar's figures over ``recent`` (the interval since the last update):
    the same shares as LoaderStats' ``data_wait_fraction`` and ``workers_busy_fraction``."""
    wall = recent.wall_s
    if wall <= 0:
        return ""
    wait = share_of(recent.stage_totals[STAGES.index("wait")], wall) or 0.0
    text = f"{recent.samples / wall:,.0f} samples/s, data wait {wait:.0%}"
    busy = fractions(recent, num_workers).workers_busy or 0.0
    text += f", {'workers' if num_workers else 'loading'} busy {busy:.0%}"
    return text


class Periodic:
    """Calls ``callback(stats)`` at most every ``every_s`` seconds of
    iteration, and at the end of each pass; ``stats.interval`` holds the
    stats since the previous call."""

    def __init__(self, callback: Callable[[LoaderStats], Any], every_s: float, snapshot: Callable[..., LoaderStats]):
        if not callable(callback):
            raise TypeError(f"on_stats needs a callable, got {type(callback).__name__}")
        if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not every_s > 0:
            raise ValueError(f"every_s must be a positive number of seconds, got {every_s!r}")
        self.callback = callback
        self._every_s = float(every_s)
        self._snapshot = snapshot
        self._due = perf_counter() + self._every_s
        self._previous: Optional[LoaderStats] = None

    def begin_pass(self, recorder: StatsRecorder, total: Optional[int]) -> None:
        pass

    def due_at(self) -> float:
        return self._due

    def tick(self, recorder: StatsRecorder, now: float) -> None:
        self._due = now + self._every_s
        self._call()

    def end_pass(self, recorder: StatsRecorder) -> None:
        self._call()

    def _call(self) -> None:
        stats = self._snapshot(since=self._previous)
        self._previous = stats
        self.callback(stats)


class JsonLinesWriter:
    """A stats callback that appends one JSON object per call to ``path``
    (``LoaderStats.to_dict()`` plus ``time``, seconds since the epoch)::

        loader.on_stats(conveyor.stats.JsonLinesWriter("stats.jsonl"), every_s=10)
    """

    def __init__(self, path: Union[str, os.PathLike, TextIO]):
        self.path = path

    def __call__(self, stats: LoaderStats) -> None:
        line = json.dumps({"time": time.time(), **stats.to_dict()}) + "\n"
        if hasattr(self.path, "write"):
            stream = cast(TextIO, self.path)  # (whatever has write, as the docstring of __init__ says)
            stream.write(line)
            stream.flush()
            return
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line)
