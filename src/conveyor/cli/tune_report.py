"""What ``conveyor tune`` prints and writes: the table, the recommendation and its advice, tune.json, tune.png.

A setting's rates are its best round (which the choice compares), the median and the slowest of
its rounds; its shares are medians of the stats' own, which stay within [0, 100%].
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from .._engine.cpu import usable_cores
from ..stats.verdict import INPUT_BOUND_WAIT
from .tune_choice import advise, leanness, measured, median_wait, noise, rate_range, tie_rule, ties, tolerance
from .tune_measure import Result, Round, available_bytes
from .tune_sweep import SweepOptions

_GB = 1 << 30
#: A noise (how far best rounds stand above the next) over this share gets a note: at that level
#: a real gain of more workers can hide in a tie.
NOISY = 0.20
#: How many of the settings tied with the recommendation the text names (tune.json lists them all).
_TIES_NAMED = 3


def _cell(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _percent(fraction: Optional[float]) -> Optional[float]:
    return None if fraction is None else 100 * fraction


#: (header, width, the cell of a Result) for each column of the table.
_COLUMNS: list[tuple[str, int, Callable[[Result], str]]] = [
    ("workers", 7, lambda r: str(r.workers)),
    ("prefetch", 8, lambda r: str(r.prefetch) if r.workers else "-"),
    ("batch", 5, lambda r: str(r.batch_size)),
    ("samples/s best", 14, lambda r: _cell(r.best_samples_per_s, ",.0f")),
    ("median", 7, lambda r: _cell(r.samples_per_s, ",.0f")),
    ("slowest", 7, lambda r: _cell(r.rate_range and r.rate_range[0], ",.0f")),
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


def format_round(number: int, rounds: int, results: list[Result]) -> str:
    """One line after each round: every setting's rate in that round, in the table's order."""
    rates = [_cell(r.rounds[number - 1].samples_per_s if len(r.rounds) >= number else None, ",.0f") for r in results]
    return f"  round {number} of {rounds}: samples/s " + " ".join(rates)


def describe_choice(rec: Optional[Result], results: list[Result]) -> str:
    """The recommendation with its spread, the settings it ties with, and the noise that made them tie."""
    if rec is None:
        return "no setting was measured: raise --max-seconds or --max-rss-gb, or check that the loader yields batches"
    low, high = rate_range(rec)
    text = (
        f"recommended: {rec.label()}: best round {high:,.0f} samples/s, median {rec.samples_per_s:,.0f}, slowest "
        f"{low:,.0f} ({len(rec.rounds)} rounds); data wait {rec.data_wait_fraction:.0%}"
    )
    others = sorted((r for r in ties(results) if r is not rec), key=leanness)
    if others:
        named = ", ".join(f"{r.label()} (best {r.best_samples_per_s:,.0f})" for r in others[:_TIES_NAMED])
        more = f" and {len(others) - _TIES_NAMED} more" if len(others) > _TIES_NAMED else ""
        text += f"\n  as fast within the noise: {named}{more}; the fewest workers, then the smallest prefetch, then "
        text += "the least memory win a tie"
    return text + (
        f"\n  (noise: a setting's best round stands {noise(results):.0%} above its next best, at the median over "
        f"the settings; {tie_rule(results)})"
    )


def describe_bound(rec: Result, results: list[Result], step_ms: float, judged: Optional[Round] = None) -> str:
    """Whether training would wait for data with ``rec``, and, if so, the advice (``tune_choice.advise``).
    ``judged``: the longer round that gave the verdict (else the median round's figures are used)."""
    if not step_ms:
        return "  (no --step-ms: the loop only waits for data; pass your step's time to see if training would)"
    wait, where = median_wait(rec), "at the median of the rounds"
    if judged is not None:
        wait, where = judged.data_wait_fraction, f"in a longer round of this setting ({judged.batches} batches)"
    if wait > INPUT_BOUND_WAIT:
        return (
            f"input-bound even so: {where} the loop waited for data {wait:.0%} of the time\n"
            f"advice: {advise(rec, results, judged)}"
        )
    return f"compute-bound: {where} the loop waited for data {wait:.0%} of the time, all a faster loader could gain"


def load_average() -> Optional[float]:
    """The machine's load average over the last minute (runnable processes, this sweep's included); None without one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def noise_note(results: list[Result], loads: tuple[Optional[float], Optional[float]], cores: int) -> str:
    """A line when the noise is too large for small differences to mean anything ("" otherwise)."""
    spread = noise(results)
    if spread <= NOISY:
        return ""
    seen = ""
    if None not in loads:
        seen = f" (load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end, on {cores} cores)"
    return (
        f"note: a setting's best round stands {spread:.0%} above its next best: the machine's load, or the data's "
        f"speed, changed while measuring{seen}. Differences smaller than that count as ties, which the fewest "
        f"workers win; on a quieter machine, or with more --rounds, more workers may prove faster"
    )


def machine_info(loads: tuple[Optional[float], Optional[float]] = (None, None)) -> dict:
    """The machine the sweep ran on, for tune.json, with its load average at the sweep's start and end."""
    from .. import __version__

    torch, available = sys.modules.get("torch"), available_bytes()
    return dict(
        cores=usable_cores(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        conveyor=__version__,
        torch=torch and torch.__version__,
        start_method=multiprocessing.get_start_method(),
        memory_available_gb=round(available / _GB, 2) if available else None,
        load_average_start=loads[0],
        load_average_end=loads[1],
    )


def _error_bars(points: list[Result], median: Callable, spread: Callable, shift: float) -> tuple[list, list, list]:
    """For matplotlib's errorbar: x (num_workers + ``shift``), y (the median of the rounds) and
    [below, above] (down to the slowest round, up to the fastest)."""
    x, y, below, above = [], [], [], []
    for r in points:
        (low, high), middle = spread(r), median(r)
        x.append(r.workers + shift)
        y.append(middle)
        below.append(middle - low)
        above.append(high - middle)
    return x, y, [below, above]


def _rates(r: Result) -> tuple[float, float]:
    return rate_range(r)


def _waits(r: Result) -> tuple[float, float]:
    waits = [100 * x.data_wait_fraction for x in r.rounds]
    return min(waits), max(waits)


def plot(results: list[Result], rec: Optional[Result], path: Path) -> None:
    """samples/s (top) and data wait % (bottom) against num_workers, a line per prefetch (and batch size):
    each point the median of its rounds, its error bar from the slowest to the best; a star on the
    recommended setting's best round (samples/s) and median (data wait)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot: no global backend to set, no GUI

    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    rate, wait = fig.subplots(2, 1, sharex=True)
    shown = [r for r in results if r.rounds]
    # Each line starts at the 0-worker point of its batch size (that setting has no prefetch).
    lines = {(r.prefetch, r.batch_size) for r in shown if r.workers} or {(None, r.batch_size) for r in shown}
    several_batches = len({r.batch_size for r in shown}) > 1
    ordered = sorted(lines, key=lambda line: (line[1] or 0, line[0] or 0))
    # Lines side by side, a little apart, so that error bars at the same worker count do not hide each other.
    shifts = {line: 0.06 * (place - (len(ordered) - 1) / 2) for place, line in enumerate(ordered)}
    for (prefetch, batch), shift in shifts.items():
        points = sorted(
            (r for r in shown if r.batch_size == batch and (r.workers == 0 or r.prefetch == prefetch)),
            key=lambda r: r.workers,
        )
        label = f"prefetch {prefetch}" if prefetch else "main process"
        label += f", batch {batch}" if several_batches else ""
        x, y, bars = _error_bars(points, lambda r: r.samples_per_s, _rates, shift)
        rate.errorbar(x, y, yerr=bars, marker="o", capsize=4, label=label)
        x, y, bars = _error_bars(points, lambda r: _percent(r.data_wait_fraction), _waits, shift)
        wait.errorbar(x, y, yerr=bars, marker="o", capsize=4)
    if rec is not None:
        star = dict(marker="*", markersize=18, color="red", linestyle="")
        at = rec.workers + (shifts.get((rec.prefetch, rec.batch_size), 0.0) if rec.workers else 0.0)
        rate.plot([at], [rec.best_samples_per_s], label=f"recommended: {rec.label()}", **star)
        wait.plot([at], [_percent(rec.data_wait_fraction)], **star)
    rounds = max((len(r.rounds) for r in shown), default=0)
    rate.set(
        title=f"conveyor tune: median of {rounds} rounds, bars from the slowest to the best\n"
        "(settings are compared by their best round)",
        ylabel="samples/s",
        ylim=(0, None),
    )
    wait.set(xlabel="num_workers", ylabel="data wait %", ylim=(0, 105), xticks=sorted({r.workers for r in shown}))
    if shown:
        rate.legend(fontsize="small")
    for ax in (rate, wait):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_outputs(
    out: Path,
    factory: str,
    loader: str,
    options: SweepOptions,
    results: list[Result],
    rec: Optional[Result],
    loads: tuple[Optional[float], Optional[float]] = (None, None),
    judged: Optional[Round] = None,
) -> None:
    """``tune.json`` (settings, machine, every row with its rounds, the noise, the recommendation with
    the settings tied with it and the round that gave its verdict) and ``tune.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    recommendation: Optional[dict[str, Any]] = None
    if rec is not None:
        recommendation = rec.to_dict()
        # With no training step the loop only waits: there is no bound to tell.
        wait = judged.data_wait_fraction if judged is not None else median_wait(rec)
        recommendation["bound"] = ("input" if wait > INPUT_BOUND_WAIT else "compute") if options.step_s else None
        recommendation["advice"] = advise(rec, results, judged)
        recommendation["verdict_round"] = asdict(judged) if judged is not None else None
        recommendation["tied_with"] = [r.label() for r in ties(results) if r is not rec]
    settings = {
        "rounds": options.rounds,
        "seconds": options.seconds,
        "min_batches": options.min_batches,
        "step_ms": options.step_s * 1000,
        "max_seconds": options.max_seconds,
        "max_rss_gb": options.budget / _GB if options.budget else None,
    }
    report = {
        "factory": factory,
        "loader": loader,
        "settings": settings,
        "machine": machine_info(loads),
        "results": [r.to_dict() for r in results],
        "noise": noise(results) if measured(results) else None,
        "tie_tolerance": tolerance(results) if measured(results) else None,
        "compared_by": "samples_per_s_max",  # each setting's best round
        "recommendation": recommendation,
    }
    (out / "tune.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out / 'tune.json'}")
    if importlib.util.find_spec("matplotlib") is None:
        print("no tune.png: matplotlib is not installed (pip install 'conveyor[plots]')")
        return
    plot(results, rec, out / "tune.png")
    print(f"wrote {out / 'tune.png'}")
