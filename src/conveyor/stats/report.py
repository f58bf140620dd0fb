"""What a loader's stats say: the frozen :class:`LoaderStats`, its table and its verdict.

    StatsRecorder.snapshot() ──▶ LoaderStats ──to_dict()──▶ JSON
                                             ──summary()──▶ table + Verdict (verdict.py)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional, TextIO

if TYPE_CHECKING:
    from .verdict import Verdict

#: The stages of one batch, in the order a batch meets them.
STAGES = ("sampler", "fetch", "collate", "transport", "queue", "pin", "wait", "compute")

#: What each stage is (the README and the summary's table say the same).
STAGE_MEANINGS = {
    "sampler": "drawing the batch's indices from the sampler (main process)",
    "fetch": "dataset[i], __getitems__ or next(iterator), seeding included (worker)",
    "collate": "collate_fn (worker)",
    "transport": "arrays into shared memory in the worker, views and tensors in the main process",
    "queue": "a loaded batch waiting in the main process for its turn and for the loop",
    "pin": "copying into pinned memory (pin_memory=True)",
    "wait": "the training loop blocked in next(), waiting for data",
    "compute": "the training loop's own time between two next() calls",
}

#: Stages that do the loading; shares of the loading time are over these.
LOADING_STAGES = ("sampler", "fetch", "collate", "transport", "pin")


@dataclass(frozen=True)
class StageStats:
    """Seconds one stage took: the total, and percentiles per batch."""

    total_s: float
    p50_s: float
    p90_s: float
    p99_s: float

    def to_dict(self) -> dict:
        return {"total_s": self.total_s, "p50_s": self.p50_s, "p90_s": self.p90_s, "p99_s": self.p99_s}


class Mark(NamedTuple):
    """Running totals at one moment; two marks subtract into an interval."""

    rows: int
    batches: int
    samples: int
    errors: int
    wall_s: float
    busy_s: float
    cpu_s: float
    cpu_wait_s: float
    startup_s: float
    stage_totals: tuple

    def minus(self, earlier: "Mark") -> "Mark":
        return Mark(
            self.rows - earlier.rows,
            self.batches - earlier.batches,
            self.samples - earlier.samples,
            self.errors - earlier.errors,
            self.wall_s - earlier.wall_s,
            self.busy_s - earlier.busy_s,
            self.cpu_s - earlier.cpu_s,
            self.cpu_wait_s - earlier.cpu_wait_s,
            self.startup_s - earlier.startup_s,
            tuple(a - b for a, b in zip(self.stage_totals, earlier.stage_totals)),
        )


def _ratio(part: float, whole: float) -> Optional[float]:
    return part / whole if whole > 0 else None


def _clip(fraction: Optional[float]) -> Optional[float]:
    """A share of loading time, kept within [0, 1] (CPU figures are read
    every few milliseconds, so a short run's totals can overshoot a little)."""
    return None if fraction is None else min(1.0, max(0.0, fraction))


@dataclass(frozen=True)
class LoaderStats:
    """Where a loader's time went, from its first ``iter()`` until now.

    Durations are in seconds, rates per second of wall time. ``wall_s``
    counts time inside passes over the data: from ``iter(loader)`` to the
    end of the pass (or to its latest batch while it runs). Every second
    of it is either ``wait`` (the loop blocked in ``next()``, starting the
    workers included) or ``compute`` (the loop's own work between batches),
    so those two stages add up to ``wall_s``. Per-stage percentiles are per
    batch, over the latest 65,536 batches at least; totals are exact.
    ``interval`` holds the same fields since an earlier snapshot (see
    ``DataLoader.stats(since=...)``; None otherwise).
    """

    batches: int
    samples: int
    #: Batches whose loading raised (they count as delivered, as in torch).
    errors: int
    wall_s: float
    samples_per_s: float
    batches_per_s: float
    #: From ``iter()`` to the first batch of the latest pass (None before any).
    first_batch_s: Optional[float]
    #: From starting the workers to the last of them being ready (None: no workers started yet).
    worker_start_s: Optional[float]
    #: How many times workers were started: once per pass, or once in all with persistent workers.
    worker_starts: int
    #: Share of wall time the loop spent blocked in ``next()``.
    data_wait_fraction: float
    #: Seconds from ``iter()`` to the first batch, summed over passes (all of it waiting).
    startup_s: float
    #: ``data_wait_fraction`` once running: start-up (``startup_s``) left out of both sides.
    steady_wait_fraction: float
    #: Share of the workers' time spent loading (fetch, collate, encode);
    #: with ``num_workers=0``, the share of wall time the main process spent loading.
    workers_busy_fraction: Optional[float]
    #: Share of the loading time (fetch, collate, encode) spent on a CPU, and
    #: spent ready to run but waiting for a free core (Linux; 0 elsewhere).
    #: The rest it waited on something else: storage, the network, a lock.
    loading_cpu_fraction: Optional[float]
    loading_cpu_wait_fraction: Optional[float]
    num_workers: int
    #: Shared-memory slots lent out at the latest batch (in flight, waiting, or held by the loop).
    slots_in_use: int
    passes: int
    #: Stage name -> StageStats, for every name in ``STAGES``.
    stages: Mapping[str, StageStats]
    #: Samples left out by skip_bad_samples since the loader was made
    #: (skips.SkippedSample: index, batch, worker, error), in order.
    skipped: tuple = ()
    interval: Optional["LoaderStats"] = None
    _mark: Optional[Mark] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_mark(cls, mark: Mark, stages: Mapping[str, StageStats], *, num_workers: int, **extras: Any) -> "LoaderStats":
        wall = mark.wall_s
        loaders = max(1, num_workers)
        return cls(
            batches=mark.batches,
            samples=mark.samples,
            errors=mark.errors,
            wall_s=wall,
            samples_per_s=mark.samples / wall if wall > 0 else 0.0,
            batches_per_s=mark.batches / wall if wall > 0 else 0.0,
            data_wait_fraction=min(1.0, _ratio(stages["wait"].total_s, wall) or 0.0),
            startup_s=mark.startup_s,
            steady_wait_fraction=min(1.0, max(0.0, _ratio(stages["wait"].total_s - mark.startup_s, wall - mark.startup_s) or 0.0)),
            workers_busy_fraction=_ratio(mark.busy_s, loaders * wall),
            loading_cpu_fraction=_clip(_ratio(mark.cpu_s, mark.busy_s)),
            loading_cpu_wait_fraction=_clip(_ratio(mark.cpu_wait_s, mark.busy_s)),
            num_workers=num_workers,
            stages=stages,
            _mark=mark,
            **extras,
        )

    def with_interval(self, interval: "LoaderStats") -> "LoaderStats":
        return replace(self, interval=interval)

    def stage_share(self, name: str) -> float:
        """The stage's share of the loading time (``LOADING_STAGES``)."""
        loading = sum(self.stages[s].total_s for s in LOADING_STAGES)
        return self.stages[name].total_s / loading if loading > 0 else 0.0

    def to_dict(self) -> dict:
        """Plain values only (``json.dumps`` takes it); ``stages`` maps each
        stage to ``{"total_s", "p50_s", "p90_s", "p99_s"}``."""
        out = {
            "batches": self.batches,
            "samples": self.samples,
            "errors": self.errors,
            "wall_s": self.wall_s,
            "samples_per_s": self.samples_per_s,
            "batches_per_s": self.batches_per_s,
            "first_batch_s": self.first_batch_s,
            "worker_start_s": self.worker_start_s,
            "worker_starts": self.worker_starts,
            "data_wait_fraction": self.data_wait_fraction,
            "startup_s": self.startup_s,
            "steady_wait_fraction": self.steady_wait_fraction,
            "workers_busy_fraction": self.workers_busy_fraction,
            "loading_cpu_fraction": self.loading_cpu_fraction,
            "loading_cpu_wait_fraction": self.loading_cpu_wait_fraction,
            "num_workers": self.num_workers,
            "slots_in_use": self.slots_in_use,
            "passes": self.passes,
            "stages": {name: stage.to_dict() for name, stage in self.stages.items()},
            "skipped": [record.to_dict() for record in self.skipped],
        }
        if self.interval is not None:
            out["interval"] = self.interval.to_dict()
        return out

    def verdict(self, cores: Optional[int] = None) -> "Verdict":
        """Input- or compute-bound, the slowest stage, and what to change."""
        from .verdict import judge

        return judge(self, cores)

    def table(self) -> str:
        """The stats as a short table (the first part of :meth:`summary`)."""
        return _table(self)

    def summary(self, file: Optional[TextIO] = None, cores: Optional[int] = None) -> "Verdict":
        """Print the table and the verdict (to ``file``, default stdout); return the verdict."""
        verdict = self.verdict(cores)
        print(f"{self.table()}\n{verdict}", file=file if file is not None else sys.stdout)
        return verdict


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


def _table(stats: LoaderStats) -> str:
    first = f"{stats.first_batch_s:.2f} s" if stats.first_batch_s is not None else "-"
    lines = [
        f"conveyor: {stats.batches:,} batches, {stats.samples:,} samples in {stats.wall_s:.2f} s "
        f"({stats.samples_per_s:,.0f} samples/s, {stats.batches_per_s:,.1f} batches/s); first batch {first}; "
        f"{stats.num_workers} worker{'s' if stats.num_workers != 1 else ''}",
        f"  {'stage':<10}{'total s':>10}{'share':>8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}",
    ]
    for name in STAGES:
        stage = stats.stages[name]
        if name in LOADING_STAGES:
            share = f"{stats.stage_share(name):7.1%}"
        elif name in ("wait", "compute") and stats.wall_s > 0:
            share = f"{stage.total_s / stats.wall_s:7.1%}"
        else:
            share = f"{'':7}"
        lines.append(f"  {name:<10}{stage.total_s:10.3f} {share}{_ms(stage.p50_s)} {_ms(stage.p90_s)} {_ms(stage.p99_s)}")
    busy, cpu = stats.workers_busy_fraction, stats.loading_cpu_fraction
    who = "workers" if stats.num_workers else "main process loading"
    line = f"  data wait {stats.data_wait_fraction:.0%} of wall time"
    if busy is not None:
        line += f" · {who} busy {busy:.0%}"
    if cpu is not None:
        line += f" · loading on a CPU {cpu:.0%} of its time"
        if stats.loading_cpu_wait_fraction:
            line += f", waiting for a free core {stats.loading_cpu_wait_fraction:.0%}"
    lines.append(line)
    lines.append("  (shares: loading stages of the loading time; wait and compute of wall time)")
    return "\n".join(lines)

