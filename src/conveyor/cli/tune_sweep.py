"""The settings ``conveyor tune`` tries, and the order and budgets it measures them in.

    plan() ─▶ settings ─▶ sweep(): round 1 over every setting, round 2 over every setting
                                   backwards, round 3 forwards, ... (interleaved, so a load that
                                   comes and goes on the machine falls on every setting alike)

A setting is skipped in round 1 when one with no more workers and no more prefetch went over
the memory budget, when the memory per worker seen so far predicts it would, or when its round
would pass the time budget; a later round runs only when all of it fits the time budget. After
the sweep, one longer round of the recommended setting gives the stats' verdict on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..stats.verdict import MIN_BATCHES, MIN_STEADY_S
from .tune_measure import Result, Round, measure_round, tree_memory_bytes, with_round

_MB = 1 << 20
#: The shortest round: shorter, and a round's rate would rest on a handful of batches. Rounds
#: are kept short so that there can be many: each is a chance to meet the machine at a quiet moment.
MIN_ROUND_S = 0.25
#: The round after the sweep that gives the recommended setting's verdict: the verdict's minimum
#: once running, and a fifth more for the later passes' first batches, which it counts as start-up.
VERDICT_ROUND_S = 1.2 * MIN_STEADY_S


@dataclass(frozen=True)
class SweepOptions:
    """How long to measure each setting, and the budgets of the whole sweep."""

    #: Rounds per setting: settings are compared by their best round, and how far it stands above
    #: the next best is the noise (tune_choice).
    rounds: int
    #: Seconds each setting is measured, over all its rounds (each round gets its share, MIN_ROUND_S at least).
    seconds: float
    #: Batches each round delivers at least, after each worker's first (more with more in flight: round_batches).
    min_batches: int
    #: The simulated training step after each batch, in seconds.
    step_s: float
    #: Seconds for the whole sweep, start-up of every loader included.
    max_seconds: float
    #: Memory budget in bytes for this process and its workers (None: no budget).
    budget: Optional[float]

    def round_batches(self, setting: Result) -> int:
        """A round delivers at least min_batches, and at least twice what can be in flight at once,
        so that the batches loaded ahead before it began are a small part of it."""
        return max(self.min_batches, 2 * setting.workers * (setting.prefetch or 0))

    @property
    def round_seconds(self) -> float:
        """A round lasts its share of ``seconds``, MIN_ROUND_S at least."""
        return max(self.seconds / self.rounds, MIN_ROUND_S)


def plan(workers: list[int], prefetches: list[int], batch_sizes: list[Optional[int]]) -> list[Result]:
    """The settings in the order they run: per batch size, 0 workers (no prefetch:
    the main process loads), then each prefetch with rising worker counts."""
    settings = []
    for batch in batch_sizes:
        settings += [Result(0, None, batch)] if 0 in workers else []
        settings += [Result(w, p, batch) for p in prefetches for w in sorted(set(workers)) if w]
    return settings


def default_workers(cores: int) -> list[int]:
    """0, 1, 2, 4, 8, ... and twice the cores (loading that waits on I/O gains past the core count)."""
    return sorted({0, 2 * cores} | {1 << k for k in range(cores.bit_length() + 1) if 1 << k < 2 * cores})


class _Sweep:
    """The sweep's books: the results so far, the memory seen, the time spent."""

    def __init__(self, settings: list[Result], build: Callable, options: SweepOptions):
        self.results, self.build, self.options = list(settings), build, options
        self.baseline = tree_memory_bytes() or 0  # this process alone, before any loader
        # The most memory per worker seen yet, all growth charged to the workers (so it errs
        # towards skipping): predicts the settings to come.
        self.per_worker = 0.0
        self.began = time.monotonic()
        self.longest_s: dict[int, float] = {}  # setting's place -> its longest round, start-up included

    def first_round_skip(self, setting: Result) -> Optional[Result]:
        """``setting`` marked skipped, or None when round 1 may measure it."""
        opts = self.options
        if self.elapsed() + max([opts.round_seconds, *self.longest_s.values()]) > opts.max_seconds:
            return replace(setting, status="skipped-time", note=f"--max-seconds {opts.max_seconds:g} reached")
        # Memory grows with workers and with prefetch: a setting with no fewer of either than one
        # that went over the budget (at the same batch size) would go over too.
        for r in self.results:
            if (
                r.status == "over-memory"
                and r.batch_size == setting.batch_size
                and r.workers <= setting.workers
                and (r.prefetch or 0) <= (setting.prefetch or 0)
            ):
                return replace(setting, status="skipped-memory", note=f"{r.label()} was over --max-rss-gb")
        predicted = self.baseline + self.per_worker * setting.workers
        if opts.budget and self.per_worker and predicted > opts.budget:
            return replace(setting, status="skipped-memory", note=f"predicted {predicted / _MB:,.0f} MB")
        return None

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def measure(self, place: int) -> None:
        """One more round of the setting at ``place``, with its memory checked against the budget."""
        setting, opts = self.results[place], self.options
        started = time.monotonic()
        measured = measure_round(self.build, setting, opts.round_seconds, opts.round_batches(setting), opts.step_s)
        self.longest_s[place] = max(self.longest_s.get(place, 0.0), time.monotonic() - started)
        if measured is None:
            self.results[place] = replace(setting, status="empty", note="no batches")
            return
        result = with_round(setting, measured)
        peak = (measured.peak_memory_mb or 0) * _MB
        if setting.workers and peak > self.baseline:
            self.per_worker = max(self.per_worker, (peak - self.baseline) / setting.workers)
        if opts.budget and peak > opts.budget:
            result = replace(result, status="over-memory", note="over --max-rss-gb")
        self.results[place] = result

    def next_round_fits(self) -> bool:
        """Whether one more round of every measured setting fits the time budget."""
        needed = sum(s for place, s in self.longest_s.items() if self.results[place].status == "measured")
        return self.elapsed() + needed <= self.options.max_seconds


def sweep(
    settings: list[Result], build: Callable, options: SweepOptions, on_round: Callable[[int, list[Result]], None]
) -> list[Result]:
    """Measure every setting ``options.rounds`` times, round by round, skipping as the module
    docstring says; ``on_round(number, results)`` after each round (from 1)."""
    books = _Sweep(settings, build, options)
    for number in range(1, options.rounds + 1):
        if number > 1 and not books.next_round_fits():
            break
        places = range(len(books.results))
        # Every other round runs backwards, so that no setting always comes first or last in a round.
        for place in places if number % 2 else reversed(places):
            setting = books.results[place]
            if number == 1 and (skipped := books.first_round_skip(setting)) is not None:
                books.results[place] = skipped
            elif setting.status == "measured":
                books.measure(place)
        on_round(number, books.results)
    return books.results


def verdict_round(build: Callable, rec: Result, options: SweepOptions, spent_s: float) -> Optional[Round]:
    """One more round of ``rec``, long enough for the stats' verdict, whose advice tune prints; None
    when it would pass ``max_seconds`` (``spent_s`` spent already). It counts toward nothing else:
    not the choice, not the table."""
    if spent_s + VERDICT_ROUND_S > options.max_seconds:
        return None
    batches = max(MIN_BATCHES, options.round_batches(rec))
    return measure_round(build, rec, max(VERDICT_ROUND_S, options.round_seconds), batches, options.step_s)
