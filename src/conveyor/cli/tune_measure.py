"""One round of ``conveyor tune``: a fresh loader for one setting, measured long enough to mean something.

    build(setting) ─▶ iter() ─▶ first batches, one per worker ─▶ s0 = loader.stats()
        ─▶ batches, each followed by the training step's sleep; a pass that ends is followed by
           the next one (workers kept), until the round has lasted its seconds AND delivered its
           batches ─▶ loader.stats(since=s0) ─▶ Round ─▶ the loader and its workers are dropped

The first batch of each worker is left out: the workers start together, so those batches arrive
nearly at once, and counting them would lift the rate of more workers (by about one batch per
extra worker over the round). A setting's rounds make its :class:`Result`.
Memory is the PSS of this process and its descendants (forked workers' shared pages count once).
"""

from __future__ import annotations

import glob
import os
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from ..dataset import is_iterable_dataset
from .factory import FactoryError

#: How often to read memory while a round runs: a read opens one /proc file
#: per process (well under a millisecond each); a peak lasts longer than this.
_MEMORY_EVERY_S = 0.25
_MB = 1 << 20


class TuneError(FactoryError):
    """A FACTORY or an option that cannot be used: printed without traceback, exit status 2."""


@dataclass(frozen=True)
class Round:
    """What one round of one setting measured, after the first batch of each worker (start-up left out)."""

    samples_per_s: float
    #: Share of the round's wall time the loop waited in next() (each later pass's first batch included).
    #: This and workers_busy_fraction are the stats' own (LoaderStats), within [0, 1] as docs/stats.md says.
    data_wait_fraction: float = 0.0
    #: Share of the workers' time spent loading.
    workers_busy_fraction: Optional[float] = None
    #: Seconds from iter() to the first batch of the round's first pass (workers starting included).
    first_batch_s: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    batches: int = 0
    passes: int = 0
    #: The verdict on this round: its bound ("unknown": too little to judge), its advice and the
    #: settings the advice names (Verdict.advised_workers, .advises_prefetch), and the loading
    #: stage with the most time and its share.
    bound: str = ""
    advice: str = ""
    advised_workers: Optional[int] = None
    advises_prefetch: bool = False
    slowest_stage: Optional[str] = None
    slowest_share: float = 0.0


@dataclass(frozen=True)
class Result:
    """One setting of the sweep and its rounds: the figures it reports are medians over them,
    with the slowest and the best round's rate (by which settings are compared)."""

    workers: int
    prefetch: Optional[int]  # None with 0 workers (the main process loads)
    batch_size: Optional[int]  # None: the loader's own
    status: str = "measured"  # or "over-memory" (measured, then over budget), "skipped-memory", "skipped-time"
    note: str = ""
    rounds: tuple[Round, ...] = field(default=())

    def label(self) -> str:
        text = f"num_workers={self.workers}" + (f", prefetch_factor={self.prefetch}" if self.workers else "")
        return text + (f", batch_size={self.batch_size}" if self.batch_size is not None else "")

    def _median(self, name: str) -> Optional[float]:
        values = [getattr(r, name) for r in self.rounds if getattr(r, name) is not None]
        return statistics.median(values) if values else None

    @property
    def samples_per_s(self) -> Optional[float]:
        """The median round's rate (None before any round)."""
        return self._median("samples_per_s")

    @property
    def best_samples_per_s(self) -> Optional[float]:
        """The fastest round's rate: what the setting does when the rest of the machine lets it."""
        rates = self.rate_range
        return rates[1] if rates else None

    @property
    def rate_range(self) -> Optional[tuple[float, float]]:
        """(slowest, fastest) round's samples/s."""
        rates = [r.samples_per_s for r in self.rounds]
        return (min(rates), max(rates)) if rates else None

    @property
    def data_wait_fraction(self) -> Optional[float]:
        return self._median("data_wait_fraction")

    @property
    def workers_busy_fraction(self) -> Optional[float]:
        return self._median("workers_busy_fraction")

    @property
    def first_batch_s(self) -> Optional[float]:
        return self._median("first_batch_s")

    @property
    def peak_memory_mb(self) -> Optional[float]:
        """The highest peak of any round."""
        peaks = [r.peak_memory_mb for r in self.rounds if r.peak_memory_mb is not None]
        return max(peaks) if peaks else None

    @property
    def median_round(self) -> Optional[Round]:
        """The round whose rate is the median (the lower middle one of an even count): its verdict speaks
        for the setting when no longer round was run for one."""
        ranked = sorted(self.rounds, key=lambda r: r.samples_per_s)
        return ranked[(len(ranked) - 1) // 2] if ranked else None

    def to_dict(self) -> dict:
        """Plain values for tune.json: the medians, the spread, and every round."""
        rates = self.rate_range
        waits = [r.data_wait_fraction for r in self.rounds]
        middle = self.median_round
        return {
            "workers": self.workers,
            "prefetch": self.prefetch,
            "batch_size": self.batch_size,
            "status": self.status,
            "note": self.note,
            "samples_per_s": self.samples_per_s,
            "samples_per_s_min": rates and rates[0],
            "samples_per_s_max": rates and rates[1],
            "data_wait_fraction": self.data_wait_fraction,
            "data_wait_fraction_min": min(waits, default=None),
            "data_wait_fraction_max": max(waits, default=None),
            "workers_busy_fraction": self.workers_busy_fraction,
            "first_batch_s": self.first_batch_s,
            "peak_memory_mb": self.peak_memory_mb,
            "batches": sum(r.batches for r in self.rounds),
            "passes": sum(r.passes for r in self.rounds),
            "advice": middle.advice if middle else "",
            "rounds": [asdict(r) for r in self.rounds],
        }


# ------------------------------------------------------------ the loader
def loader_builder(made: Any, batch_size: int, use_torch: bool) -> tuple[Callable[[Result], Any], str, bool]:
    """(setting -> fresh loader, a description, whether batch_size can vary) for what FACTORY returned.

    Loaders with workers keep them between passes (``persistent_workers=True``): a round that
    runs several passes measures loading, not starting processes again.
    """
    import conveyor

    if isinstance(made, conveyor.DataLoader):
        cls, base = type(made), _loader_kwargs(made)
        can_batch = "batch_sampler" not in base and made.batch_size is not None
        described = f"{made!r} from the factory"
    else:
        iterable = is_iterable_dataset(made)
        base = {"dataset": made, "batch_size": batch_size, "shuffle": None if iterable else True}
        can_batch = True
        if use_torch:
            import conveyor.torch

        cls = conveyor.torch.DataLoader if use_torch else conveyor.DataLoader
        described = f"{'conveyor.torch' if use_torch else 'conveyor'}.DataLoader({type(made).__name__}, "
        described += f"batch_size={batch_size}" + (")" if iterable else ", shuffle=True)")
    context = base.pop("multiprocessing_context", None)  # allowed only with workers

    def build(setting: Result) -> Any:
        kwargs = dict(base, num_workers=setting.workers, persistent_workers=setting.workers > 0)
        if setting.batch_size is not None:
            kwargs["batch_size"] = setting.batch_size
        if setting.workers:
            kwargs.update(prefetch_factor=setting.prefetch, multiprocessing_context=context)
        with warnings.catch_warnings():
            # More workers than cores is part of the sweep: loading that waits on I/O gains from it.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            return cls(**kwargs)

    try:
        build(Result(0, None, None))  # what a DataLoader rejects fails here, before the sweep
    except (TypeError, ValueError) as exc:
        raise TuneError(f"the factory returned a {type(made).__name__}, which DataLoader rejects: {exc}") from None
    return build, described, can_batch


#: The DataLoader arguments that a loader returned by FACTORY passes on to every setting.
_KEPT = (
    "dataset",
    "batch_size",
    "drop_last",
    "collate_fn",
    "pin_memory",
    "pin_memory_device",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "in_order",
    "stall_warning",
    "generator",
    "worker_method",
    "reads_in_flight",
    "skip_bad_samples",
)


def _loader_kwargs(loader: Any) -> dict:
    """The arguments that rebuild ``loader``, less num_workers, prefetch_factor and persistent_workers."""
    # collate_fn is passed as the very function, so conveyor's own collate keeps its fast route.
    kwargs = {name: getattr(loader, name) for name in _KEPT}
    kwargs["seed"] = loader.seed if loader.generator is None else None  # the generator seeds then
    if loader._iterable:
        return kwargs
    batches = loader.batch_sampler
    if batches is None or (type(batches) is loader._BatchSampler and batches.sampler is loader.sampler):
        kwargs["sampler"] = loader.sampler  # shuffled or not, as the factory chose
    else:  # the user's own batch sampler decides the batches
        kwargs.update(batch_sampler=batches, batch_size=1, drop_last=False)
    return kwargs


# ---------------------------------------------------------------- memory
def _process_bytes(pid: int) -> int:
    """PSS (each shared page split among its users, so the pages forked workers
    share count once), else RSS; 0 once the process is gone."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except OSError:
            continue
    return 0


def tree_memory_bytes(pid: Optional[int] = None) -> Optional[int]:
    """Memory of ``pid`` (default: this process) and all its descendants; None without /proc."""
    pid = os.getpid() if pid is None else pid
    if not os.path.exists(f"/proc/{pid}"):
        return None
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += _process_bytes(current)
        # Each child is listed under the thread that started it.
        for children in glob.glob(f"/proc/{current}/task/*/children"):
            try:
                with open(children) as f:
                    todo.extend(int(child) for child in f.read().split())
            except OSError:  # the thread ended, or a kernel without CONFIG_PROC_CHILDREN
                pass
    return total


def available_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo; None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            return int(dict(line.split(":", 1) for line in f)["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


# ----------------------------------------------------------------- a round
def _batches(loader: Any) -> Iterator[int]:
    """The number of the pass (from 1) for each batch of ``loader``, pass after pass (the workers
    kept between them), until a pass yields nothing."""
    number = 0
    while True:
        number += 1
        delivered = 0
        for _ in loader:
            delivered += 1
            yield number
        if not delivered:
            return


def measure_round(
    build: Callable[[Result], Any], setting: Result, seconds: float, min_batches: int, step_s: float
) -> Optional[Round]:
    """One round of ``setting`` (None when its loader yields no batch): after the first batch of each
    worker, at least ``seconds`` and ``min_batches`` batches, ``step_s`` of sleep after each, over as
    many passes as that takes."""
    loader = build(setting)
    batches = _batches(loader)
    try:
        if next(batches, None) is None:
            return None
        first_batch_s = loader.stats().first_batch_s
        for _ in range(setting.workers - 1):  # the others' first batches, loaded alongside the first
            time.sleep(step_s)
            next(batches, None)
        start = loader.stats()
        time.sleep(step_s)
        peak, counted, passes = 0, 0, 1
        deadline, next_memory = time.perf_counter() + seconds, 0.0
        while counted < min_batches or time.perf_counter() < deadline:
            number = next(batches, None)
            if number is None:  # a pass without batches: nothing more to load
                break
            passes = number
            time.sleep(step_s)
            counted += 1
            if time.perf_counter() >= next_memory:
                peak, next_memory = max(peak, tree_memory_bytes() or 0), time.perf_counter() + _MEMORY_EVERY_S
        peak = max(peak, tree_memory_bytes() or 0)
        stats = loader.stats(since=start)
    finally:
        del batches, loader  # ends the pass and stops the workers before the next round starts
    steady = stats.interval if stats.interval is not None and stats.interval.batches else stats
    verdict = steady.verdict()
    return Round(
        samples_per_s=steady.samples_per_s,
        data_wait_fraction=steady.data_wait_fraction,
        workers_busy_fraction=steady.workers_busy_fraction,
        first_batch_s=first_batch_s,
        peak_memory_mb=peak / _MB if peak else None,
        batches=steady.batches,
        passes=passes,
        bound=verdict.bound,
        advice=verdict.advice,
        advised_workers=verdict.advised_workers,
        advises_prefetch=verdict.advises_prefetch,
        slowest_stage=verdict.slowest_stage,
        slowest_share=verdict.slowest_share,
    )


def with_round(result: Result, measured: Round) -> Result:
    """``result`` with one more round."""
    return replace(result, rounds=result.rounds + (measured,))
