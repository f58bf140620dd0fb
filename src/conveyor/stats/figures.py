"""The figures of a loader's stats: the stages, the raw totals and the shares made of them.

    StatsRecorder ──Mark (raw totals)──▶ fractions() ──▶ the shares of LoaderFigures
    LoaderFigures ──to_dict()──▶ JSON (the shares and the raw totals they are made of)

Every share is one raw total over another (:func:`share_of`), so it lies in
[0, 1], and the shares that split one whole add up to it. :class:`LoaderFigures`
holds the figures alone; ``LoaderStats`` (report.py) adds the ways of showing
them, which table.py and verdict.py build on these figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional

from .machine import CoreUse
from .workers import NodeStats, PerWorker, WorkerStats

if TYPE_CHECKING:
    from ..mix import MixReport

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
    """Running totals at one moment; two marks subtract into an interval
    (``StatsRecorder.interval`` also cuts ``busy_s``)."""

    rows: int
    batches: int
    samples: int
    errors: int
    #: Seconds inside passes, and when the latest of them ended (a perf_counter reading).
    wall_s: float
    at: float
    #: Seconds the loaders spent loading inside passes (fetch, collate, encode).
    busy_s: float
    #: Batches whose CPU figures were measured (and of those, whose wait for
    #: a core was), their loading seconds, and within those the seconds on
    #: a CPU and waiting for a core.
    cpu_batches: int
    cpu_wait_batches: int
    cpu_measured_s: float
    cpu_s: float
    cpu_wait_s: float
    startup_s: float
    stage_totals: tuple
    #: Who used the cores during passes (machine.py); None: not read, or not measured here.
    cores: Optional[CoreUse] = None
    #: The same batches, samples and loading seconds per worker and node (workers.py).
    workers: PerWorker = PerWorker()

    def minus(self, earlier: "Mark") -> "Mark":
        """The totals since ``earlier`` (``at`` stays this mark's)."""
        values = {
            name: getattr(self, name) - getattr(earlier, name)
            for name in self._fields
            if name not in ("at", "stage_totals", "cores", "workers")
        }
        cores = None
        if self.cores is not None and earlier.cores is not None:
            cores = self.cores.minus(earlier.cores)
        stages = tuple(a - b for a, b in zip(self.stage_totals, earlier.stage_totals))
        return Mark(**values, at=self.at, stage_totals=stages, cores=cores, workers=self.workers.minus(earlier.workers))


def share_of(part: float, whole: float) -> Optional[float]:
    """``part / whole`` kept within [0, 1]; None when the whole is empty.
    The raw totals keep each part within its whole; the cut only guards
    float rounding."""
    if not whole > 0:
        return None
    return min(1.0, max(0.0, part / whole))


class Fractions(NamedTuple):
    """The shares a Mark gives (None: not measured, or nothing to share)."""

    workers_busy: Optional[float]
    loading_cpu: Optional[float]
    loading_cpu_wait: Optional[float]
    loading_off_cpu: Optional[float]
    cores_job: Optional[float]
    cores_others: Optional[float]
    cores_idle: Optional[float]


def fractions(mark: Mark, num_workers: int) -> Fractions:
    """The shares of ``mark``'s raw totals; each split adds up to its whole:

    * workers busy: loading seconds / (loaders × wall seconds);
    * loading time of the measured batches = on a CPU + waiting for a core
      + waiting on something else (the rest);
    * the usable cores' capacity = this job + other processes + idle."""
    busy = share_of(mark.busy_s, max(1, num_workers) * mark.wall_s)
    cpu = share_of(mark.cpu_s, mark.cpu_measured_s) if mark.cpu_batches else None
    cpu_wait = off_cpu = None
    if cpu is not None and mark.cpu_wait_batches:
        cpu_wait = min(share_of(mark.cpu_wait_s, mark.cpu_measured_s) or 0.0, 1.0 - cpu)
        off_cpu = max(0.0, 1.0 - cpu - cpu_wait)
    job = others = idle = None
    cores = mark.cores
    if cores is not None and cores.capacity_s > 0:
        job = share_of(cores.job_s, cores.capacity_s) or 0.0  # (a share: the capacity is above 0)
        others = min(share_of(cores.busy_s - cores.job_s, cores.capacity_s) or 0.0, 1.0 - job)
        idle = max(0.0, 1.0 - job - others)
    return Fractions(busy, cpu, cpu_wait, off_cpu, job, others, idle)


#: What the table and the verdict say of a figure this system does not measure.
NOT_MEASURED = "not measured on this system"


@dataclass(frozen=True)
class LoaderFigures:
    """Where a loader's time went, from its first ``iter()`` until now: the
    figures of :class:`~conveyor.stats.LoaderStats`, which adds the table and the verdict.

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
    #: Share of the workers' time spent loading (fetch, collate, encode):
    #: their loading seconds inside passes / (workers × ``wall_s``); with
    #: ``num_workers=0``, the share of wall time the main process spent loading.
    workers_busy_fraction: Optional[float]
    #: The loading time of the measured batches (``cpu_measured_batches``)
    #: splits three ways: on a CPU, ready to run but waiting for a free core,
    #: and waiting on something else (storage, the network, a lock, a sleep).
    #: Measured by each loading thread (docs/stats.md); None: not measured.
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
    #: The third part of the loading time (see ``loading_cpu_fraction``).
    loading_off_cpu_fraction: Optional[float] = None
    #: Batches the three loading shares cover (every batch longer than a
    #: millisecond; shorter ones are sampled).
    cpu_measured_batches: int = 0
    #: The usable cores' capacity during passes splits three ways: this job
    #: (the main process, its reaped children, the workers), every other
    #: process on the machine, and idle (Linux; None elsewhere).
    cores: Optional[int] = None
    cores_job_fraction: Optional[float] = None
    cores_others_fraction: Optional[float] = None
    cores_idle_fraction: Optional[float] = None
    #: Where the workers ran: "inline" (num_workers=0), "thread", "ray" (Ray
    #: actors, perhaps on other machines), or the process start method ("" unknown).
    worker_method: str = ""
    #: Each worker's batches and busy share (one per worker id and node it
    #: loaded on; -1: the main process), and each node's: workers.py, docs/stats.md.
    workers: tuple[WorkerStats, ...] = ()
    nodes: tuple[NodeStats, ...] = ()
    #: Over a ``conveyor.Mix``: the latest pass's delivered samples per source against their
    #: target, and each source's epoch (mix.MixReport; None for any other dataset).
    mix: Optional["MixReport"] = None
    interval: Optional["LoaderFigures"] = None
    _mark: Optional[Mark] = field(default=None, repr=False, compare=False)

    def stage_share(self, name: str) -> float:
        """The stage's share of the loading time (``LOADING_STAGES``)."""
        loading = sum(self.stages[s].total_s for s in LOADING_STAGES)
        return share_of(self.stages[name].total_s, loading) or 0.0

    def to_dict(self) -> dict:
        """Plain values only (``json.dumps`` takes it); ``stages`` maps each
        stage to ``{"total_s", "p50_s", "p90_s", "p99_s"}``; ``raw`` holds
        the totals every share is made of (docs/stats.md says which)."""
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
            "loading_off_cpu_fraction": self.loading_off_cpu_fraction,
            "cpu_measured_batches": self.cpu_measured_batches,
            "cores": self.cores,
            "cores_job_fraction": self.cores_job_fraction,
            "cores_others_fraction": self.cores_others_fraction,
            "cores_idle_fraction": self.cores_idle_fraction,
            "num_workers": self.num_workers,
            "worker_method": self.worker_method,
            "slots_in_use": self.slots_in_use,
            "passes": self.passes,
            "stages": {name: stage.to_dict() for name, stage in self.stages.items()},
            "skipped": [record.to_dict() for record in self.skipped],
            "workers": [worker.to_dict() for worker in self.workers],
            "nodes": [node.to_dict() for node in self.nodes],
            "mix": self.mix.to_dict() if self.mix is not None else None,
        }
        if self._mark is not None:
            out["raw"] = _raw(self._mark)
        if self.interval is not None:
            out["interval"] = self.interval.to_dict()
        return out


def _cores_read(mark: Mark) -> Optional[int]:
    """How many cores the core-use figures cover (None: not measured)."""
    cores = mark.cores
    if cores is None or cores.window_s <= 0:
        return None
    return round(cores.capacity_s / cores.window_s)


def _raw(mark: Mark) -> dict:
    """The totals the shares are made of (docs/stats.md, "Which figure splits which whole")."""
    raw = {
        "loading_busy_s": mark.busy_s,
        "cpu_measured_batches": mark.cpu_batches,
        "cpu_wait_measured_batches": mark.cpu_wait_batches,
        "cpu_measured_loading_s": mark.cpu_measured_s,
        "cpu_s": mark.cpu_s,
        "cpu_wait_s": mark.cpu_wait_s,
    }
    if mark.cores is not None:
        raw.update(
            cores_window_s=mark.cores.window_s,
            cores_capacity_s=mark.cores.capacity_s,
            cores_busy_s=mark.cores.busy_s,
            cores_job_s=mark.cores.job_s,
        )
    return raw
