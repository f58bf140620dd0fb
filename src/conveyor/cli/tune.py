"""Measure your own loader over a sweep of num_workers and prefetch_factor, and recommend a setting.

``conveyor tune MODULE:FACTORY`` (or ``path/to/file.py:FACTORY``) calls
``FACTORY()``. A dataset it returns is loaded with ``DataLoader(dataset,
batch_size=--batch-size, shuffle=True)`` (``--torch``: conveyor.torch's); of
a conveyor DataLoader it returns, all but num_workers, prefetch_factor and
batch_size (``--batch-sizes``) is kept. Each setting gets a fresh loader:

    iter() ─▶ first batch ─▶ s0 = loader.stats() ─▶ batches, each followed by --step-ms
    of sleep (the training step), for --seconds or to the pass's end ─▶ stats(since=s0)

so the rates leave start-up out (it is the "first batch" column). Peak memory
is the PSS of this process and its descendants. A setting is skipped when
one with no more workers and no more prefetch went over ``--max-rss-gb``, when
the memory per worker seen so far predicts it would, and once ``--max-seconds``
would be passed. The recommendation is the fastest setting, or the one with
the fewest workers (then prefetch, then batch) within 5% of it. Exit status:
0; 1 when no setting was measured; 2 for a FACTORY that cannot be found or used.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ..arguments import is_iterable_dataset
from .factory import FactoryError, load_factory
from ..stats.verdict import INPUT_BOUND_WAIT
from .._engine.cpu import usable_cores

#: Settings within this share of the best rate count as just as fast; among
#: them the fewest workers win, since each worker holds memory of its own.
NEAR_BEST = 0.05
#: How often to read memory while a setting runs: a read opens one /proc file
#: per process (well under a millisecond each); a peak lasts longer than this.
_MEMORY_EVERY_S = 0.25
#: The default --max-rss-gb: this share of what is free at start plus what
#: this process holds already, leaving room for the rest of the machine.
_DEFAULT_MEMORY_SHARE = 0.8
_MB = 1 << 20
_GB = 1 << 30


class TuneError(FactoryError):
    """A FACTORY or an option that cannot be used: printed without traceback, exit status 2."""


@dataclass(frozen=True)
class Result:
    """One setting of the sweep and what it measured (rates exclude start-up)."""

    workers: int
    prefetch: Optional[int]  # None with 0 workers (the main process loads)
    batch_size: Optional[int]  # None: the loader's own
    status: str = "measured"  # or "over-memory" (measured, then over budget), "skipped-memory", "skipped-time"
    note: str = ""
    samples_per_s: Optional[float] = None
    data_wait_fraction: Optional[float] = None
    workers_busy_fraction: Optional[float] = None
    first_batch_s: Optional[float] = None
    peak_memory_mb: Optional[float] = None
    batches: int = 0
    advice: str = ""  # the verdict's advice on the measured interval

    def label(self) -> str:
        text = f"num_workers={self.workers}" + (f", prefetch_factor={self.prefetch}" if self.workers else "")
        return text + (f", batch_size={self.batch_size}" if self.batch_size is not None else "")


# ------------------------------------------------------------ the factory
def loader_builder(made: Any, batch_size: int, use_torch: bool) -> tuple[Callable[[Result], Any], str, bool]:
    """(setting -> fresh loader, a description, whether batch_size can vary) for what FACTORY returned."""
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
        kwargs = dict(base, num_workers=setting.workers, persistent_workers=False)
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
    "dataset", "batch_size", "drop_last", "collate_fn", "pin_memory", "pin_memory_device", "timeout",
    "worker_init_fn", "multiprocessing_context", "in_order", "stall_warning", "generator",
)  # fmt: skip


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


def _available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            return int(dict(line.split(":", 1) for line in f)["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


# ----------------------------------------------------------------- sweep
def measure(loader: Any, setting: Result, seconds: float, step_s: float) -> Result:
    """One pass for ``seconds`` after its first batch (or to its end), sleeping ``step_s`` after each batch."""
    peak, ended = 0, True
    it = iter(loader)
    try:
        try:
            next(it)
        except StopIteration:
            return replace(setting, note="no batches")
        start = loader.stats()
        time.sleep(step_s)
        deadline, next_memory = time.perf_counter() + seconds, 0.0
        for _ in it:
            time.sleep(step_s)
            now = time.perf_counter()
            if now >= next_memory:
                peak, next_memory = max(peak, tree_memory_bytes() or 0), now + _MEMORY_EVERY_S
            if now >= deadline:
                ended = False
                break
        peak = max(peak, tree_memory_bytes() or 0)
        stats = loader.stats(since=start)
    finally:
        del it  # ends the pass now: its workers stop before the next setting starts
    steady = stats.interval if stats.interval is not None and stats.interval.batches else stats
    return replace(
        setting,
        note="the pass ended first" if ended else "",
        samples_per_s=steady.samples_per_s,
        data_wait_fraction=steady.data_wait_fraction,
        workers_busy_fraction=steady.workers_busy_fraction,
        first_batch_s=stats.first_batch_s,
        peak_memory_mb=peak / _MB if peak else None,
        batches=stats.batches,
        advice=steady.verdict().advice,
    )


def plan(workers: list[int], prefetches: list[int], batch_sizes: list[Optional[int]]) -> list[Result]:
    """The settings in the order they run: per batch size, 0 workers (no prefetch:
    the main process loads), then each prefetch with rising worker counts."""
    settings = []
    for batch in batch_sizes:
        settings += [Result(0, None, batch)] if 0 in workers else []
        settings += [Result(w, p, batch) for p in prefetches for w in sorted(set(workers)) if w]
    return settings


def sweep(
    settings: list[Result], build: Callable, args: argparse.Namespace, budget: Optional[int], on_row: Callable
) -> list[Result]:
    """Measure each setting in turn, skipping as the module docstring says."""
    baseline = tree_memory_bytes() or 0  # this process alone, before any loader
    # The most memory per worker seen yet, all growth charged to the workers (so it errs towards
    # skipping): predicts the settings to come.
    per_worker = 0.0
    began, longest, results = time.monotonic(), 0.0, []
    for setting in settings:
        predicted = baseline + per_worker * setting.workers
        # Memory grows with workers and with prefetch: a setting with no fewer of either than one
        # that went over the budget (at the same batch size) would go over too.
        over = [
            r.label()
            for r in results
            if r.status == "over-memory" and r.batch_size == setting.batch_size
            and r.workers <= setting.workers and (r.prefetch or 0) <= (setting.prefetch or 0)
        ]  # fmt: skip
        if time.monotonic() - began + max(args.seconds, longest) > args.max_seconds:
            result = replace(setting, status="skipped-time", note=f"--max-seconds {args.max_seconds:g} reached")
        elif over:
            result = replace(setting, status="skipped-memory", note=f"{over[0]} was over --max-rss-gb")
        elif budget and per_worker and predicted > budget:
            result = replace(setting, status="skipped-memory", note=f"predicted {predicted / _MB:,.0f} MB")
        else:
            started = time.monotonic()
            result = measure(build(setting), setting, args.seconds, args.step_ms / 1000)
            longest = max(longest, time.monotonic() - started)  # start-up included: it takes time too
            peak = (result.peak_memory_mb or 0) * _MB
            if setting.workers and peak > baseline:
                per_worker = max(per_worker, (peak - baseline) / setting.workers)
            if budget and peak > budget:
                result = replace(result, status="over-memory", note="over --max-rss-gb")
        results.append(result)
        on_row(result)
    return results


def recommend(results: list[Result]) -> Optional[Result]:
    """The fastest measured setting, or the leanest one within NEAR_BEST of it."""
    measured = [r for r in results if r.status == "measured" and r.samples_per_s]
    if not measured:
        return None
    best = max(r.samples_per_s for r in measured)
    near = [r for r in measured if r.samples_per_s >= (1 - NEAR_BEST) * best]
    return min(near, key=lambda r: (r.workers, r.prefetch or 0, r.batch_size or 0))


def default_workers(cores: int) -> list[int]:
    """0, 1, 2, 4, 8, ... and twice the cores (loading that waits on I/O gains past the core count)."""
    return sorted({0, 2 * cores} | {1 << k for k in range(cores.bit_length() + 1) if 1 << k < 2 * cores})


# ---------------------------------------------------------------- output
def _cell(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _percent(fraction: Optional[float]) -> Optional[float]:
    return None if fraction is None else 100 * fraction


#: (header, width, the cell of a Result) for each column of the table.
_COLUMNS = [
    ("workers", 7, lambda r: str(r.workers)),
    ("prefetch", 8, lambda r: str(r.prefetch) if r.workers else "-"),
    ("batch", 5, lambda r: str(r.batch_size)),
    ("samples/s", 10, lambda r: _cell(r.samples_per_s, ",.1f")),
    ("data wait %", 11, lambda r: _cell(_percent(r.data_wait_fraction), ".0f")),
    ("workers busy %", 14, lambda r: _cell(_percent(r.workers_busy_fraction), ".0f")),
    ("first batch s", 13, lambda r: _cell(r.first_batch_s, ".2f")),
    ("peak MB", 8, lambda r: _cell(r.peak_memory_mb, ",.0f")),
]


def format_row(r: Optional[Result], with_batch: bool) -> str:
    """A row of the table, or its header when ``r`` is None."""
    columns = [c for c in _COLUMNS if with_batch or c[0] != "batch"]
    line = "  ".join(f"{name if r is None else cell(r):>{width}}" for name, width, cell in columns)
    return line + (f"  {r.note}" if r is not None and r.note else "")


def describe(rec: Optional[Result], results: list[Result], step_ms: float) -> str:
    """The recommendation, and whether training would wait for data with it."""
    if rec is None:
        return "no setting was measured: raise --max-seconds or --max-rss-gb, or check that the loader yields batches"
    best = max((r for r in results if r.status == "measured" and r.samples_per_s), key=lambda r: r.samples_per_s)
    text = f"recommended: {rec.label()}: {rec.samples_per_s:,.1f} samples/s, data wait {rec.data_wait_fraction:.0%}"
    if rec is not best:
        text += f"\n  (within {NEAR_BEST:.0%} of the fastest, {best.label()} at {best.samples_per_s:,.1f} samples/s)"
    wait = rec.data_wait_fraction
    if not step_ms:
        return text + "\n  (no --step-ms: the loop only waits for data; pass your step's time to see if training would)"
    if wait > INPUT_BOUND_WAIT:
        return text + f"\ninput-bound even so: the loop waits for data {wait:.0%} of the time\nadvice: {rec.advice}"
    return text + f"\ncompute-bound: the loop waits for data {wait:.0%} of the time, all a faster loader could gain"


def machine_info() -> dict:
    from .. import __version__

    torch, available = sys.modules.get("torch"), _available_bytes()
    return dict(
        cores=usable_cores(), cpu_count=os.cpu_count(), platform=platform.platform(),
        python=platform.python_version(), conveyor=__version__, torch=torch and torch.__version__,
        start_method=multiprocessing.get_start_method(),
        memory_available_gb=round(available / _GB, 2) if available else None,
    )  # fmt: skip


def plot(results: list[Result], rec: Optional[Result], path: Path) -> None:
    """samples/s (top) and data wait % (bottom) against num_workers, a line per prefetch (and batch size)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot: no global backend to set, no GUI

    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    rate, wait = fig.subplots(2, 1, sharex=True)
    measured = [r for r in results if r.samples_per_s is not None]
    # Each line starts at the 0-worker point of its batch size (that setting has no prefetch).
    lines = {(r.prefetch, r.batch_size) for r in measured if r.workers} or {(None, r.batch_size) for r in measured}
    several_batches = len({r.batch_size for r in measured}) > 1
    for prefetch, batch in sorted(lines, key=lambda line: (line[1] or 0, line[0] or 0)):
        points = sorted(
            (r for r in measured if r.batch_size == batch and (r.workers == 0 or r.prefetch == prefetch)),
            key=lambda r: r.workers,
        )
        label = f"prefetch {prefetch}" if prefetch else "main process"
        label += f", batch {batch}" if several_batches else ""
        rate.plot([r.workers for r in points], [r.samples_per_s for r in points], marker="o", label=label)
        wait.plot([r.workers for r in points], [_percent(r.data_wait_fraction) for r in points], marker="o")
    if rec is not None:
        star = dict(marker="*", markersize=18, color="red", linestyle="")
        rate.plot([rec.workers], [rec.samples_per_s], label=f"recommended: {rec.label()}", **star)
        wait.plot([rec.workers], [_percent(rec.data_wait_fraction)], **star)
    rate.set(title="conveyor tune", ylabel="samples/s", ylim=(0, None))
    wait.set(xlabel="num_workers", ylabel="data wait %", ylim=(0, 105), xticks=sorted({r.workers for r in measured}))
    rate.legend(fontsize="small")
    for ax in (rate, wait):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_outputs(
    args: argparse.Namespace, results: list[Result], rec: Optional[Result], loader: str, budget: Optional[float]
) -> None:
    """``tune.json`` (settings, machine, every row, the recommendation) and ``tune.png`` under ``--out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    recommendation = asdict(rec) if rec is not None else None
    if rec is not None:  # with no training step the loop only waits: there is no bound to tell
        bound = "input" if rec.data_wait_fraction > INPUT_BOUND_WAIT else "compute"
        recommendation["bound"] = bound if args.step_ms else None
    report = {
        "factory": args.factory,
        "loader": loader,
        "settings": {name: getattr(args, name) for name in ("seconds", "step_ms", "max_seconds")}
        | {"max_rss_gb": budget / _GB if budget else None},
        "machine": machine_info(),
        "results": [asdict(r) for r in results],
        "recommendation": recommendation,
    }
    (args.out / "tune.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out / 'tune.json'}")
    if importlib.util.find_spec("matplotlib") is None:
        print("no tune.png: matplotlib is not installed (pip install 'conveyor[plots]')")
        return
    plot(results, rec, args.out / "tune.png")
    print(f"wrote {args.out / 'tune.png'}")


# ------------------------------------------------------------- the command
def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, e.g. 0,1,2,4; got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("factory", metavar="MODULE:FACTORY", help="a function returning a dataset or a DataLoader")
    add("--workers", type=_int_list, help="num_workers to try, e.g. 0,1,2,4 (default: 0,1,2,4,... to twice the cores)")
    add("--prefetch", type=_int_list, default=[2, 4], help="prefetch_factor values to try (default 2,4)")
    add("--batch-sizes", type=_int_list, help="batch sizes to try (default: the loader's own)")
    add("--batch-size", type=int, default=32, help="batch size when FACTORY returns a dataset (default 32)")
    add("--torch", action="store_true", help="load a dataset with conveyor.torch.DataLoader (torch tensors)")
    add("--step-ms", type=float, default=0.0, help="a simulated training step per batch, in ms (default 0)")
    add("--seconds", type=float, default=3.0, help="seconds to measure each setting (default 3)")
    add("--max-seconds", type=float, default=120.0, help="seconds for the whole sweep (default 120)")
    add("--max-rss-gb", type=float, help="memory budget in GB (default: 80%% of the memory free at start)")
    add("--out", type=Path, help="a folder for tune.json and tune.png")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except FactoryError as exc:
        print(f"conveyor tune: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if min(args.prefetch) < 1 or min(args.batch_sizes or [1]) < 1:
        raise TuneError("--prefetch and --batch-sizes values must be at least 1")
    build, loader, can_batch = loader_builder(load_factory(args.factory)(), args.batch_size, args.torch)
    if args.torch and loader.endswith("from the factory"):
        print("conveyor tune: note: --torch is for a dataset; the factory's DataLoader class is kept", file=sys.stderr)
    if args.batch_sizes and not can_batch:
        raise TuneError("--batch-sizes needs a loader that batches by batch_size; this one has a batch_sampler")
    cores = usable_cores()
    budget = args.max_rss_gb * _GB if args.max_rss_gb else None
    if budget is None and (available := _available_bytes()) is not None:
        budget = int(_DEFAULT_MEMORY_SHARE * (available + (tree_memory_bytes() or 0)))
    settings = plan(args.workers or default_workers(cores), args.prefetch, args.batch_sizes or [None])
    print(
        f"conveyor tune: {loader}\n  {cores} cores; {args.seconds:g} s per setting, training step {args.step_ms:g} ms; "
        f"at most {args.max_seconds:g} s and {_cell(budget and budget / _GB, '.3g')} GB"
    )
    with_batch = bool(args.batch_sizes)
    print(format_row(None, with_batch), flush=True)
    results = sweep(settings, build, args, budget, lambda r: print(format_row(r, with_batch), flush=True))
    rec = recommend(results)
    print(describe(rec, results, args.step_ms))
    if args.out is not None:
        write_outputs(args, results, rec, loader, budget)
    return 0 if rec is not None else 1
