"""Run an image pipeline through conveyor and torch.utils.data, side by side.

On first run it writes a small synthetic JPEG folder (cached under
~/.cache/conveyor; nothing is downloaded) in the usual root/<class>/<image>
layout; --data DIR reads a real folder laid out the same way. Each sample
is decoded with Pillow, randomly cropped and flipped; batches are uint8
images (B, 3, crop, crop) and int64 labels.

Both loaders get the same arguments (batch size, shuffle, num_workers,
persistent workers) and the same loop, with a small step per batch (a sum
over its bytes); their epochs take turns, each with a live bar. Then come
conveyor's stats (loader.stats().summary(): a table and a verdict), both
loaders' samples/s side by side, and a PNG of samples/s and data wait over
time. Data wait is timed alike for both: the time the loop spends blocked
in iter() and next(). Without torch installed, conveyor runs alone.

examples:
  conveyor demo
  conveyor demo --data ~/datasets/imagenette/train --workers 4
"""

from __future__ import annotations

# (The docstring above is `conveyor demo --help`.) The data, a synthetic JPEG
# folder and the dataset that reads it, is demo_data.py's; here: the loop
# each loader runs, the race between them, and the report.
import argparse
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Iterable, Optional

import numpy as np

from .demo_data import ImageFolder, default_cache_dir, is_made, make_synthetic_images, synthetic_folder

#: What examples/images.py and bench/run.py import from here, besides the run's own names.
__all__ = ["ImageFolder", "default_cache_dir", "make_synthetic_images", "RunResult", "Span", "write_plot"]

#: One point of the plot: long enough to hold several batches, short enough to show the start-up.
WINDOW_S = 0.5
_PIPELINE = "JPEG decode + random crop + flip + collate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help="an image folder, root/<class>/<image> (default: synthetic)",
    )
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="num_workers of both loaders (default 2)")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per batch (default 32)")
    parser.add_argument(
        "--epochs", type=int, default=4, metavar="N", help="epochs per loader (default 4: about 10 s in all on 2 cores)"
    )
    parser.add_argument("--crop", type=int, default=224, metavar="PIXELS", help="side of the random crop (default 224)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the shuffles and crops (default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text (no bars)")
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path("conveyor-demo.png"),
        metavar="PNG",
        help="where the plot goes (default ./conveyor-demo.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")


# ------------------------------------------------------------ the loop
@dataclass(frozen=True)
class Span:
    """A stretch of one loader's loop: its samples and its data wait (the
    time blocked in ``iter()`` or ``next()``). Times are seconds of that
    loop (its own epochs only) since its first ``iter()``."""

    start_s: float
    end_s: float
    samples: int
    wait_s: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / (self.end_s - self.start_s) if self.end_s > self.start_s else 0.0

    @property
    def data_wait_fraction(self) -> float:
        return min(1.0, self.wait_s / (self.end_s - self.start_s)) if self.end_s > self.start_s else 0.0

    def __add__(self, later: "Span") -> "Span":
        return Span(self.start_s, later.end_s, self.samples + later.samples, self.wait_s + later.wait_s)


@dataclass(frozen=True)
class RunResult:
    """What the loop measured over one loader's epochs: in all, and per
    window of about ``WINDOW_S`` (the steps of the plot)."""

    loader: str
    #: Seconds from the first ``iter()`` to the first batch (starting the workers included).
    first_batch_s: float
    total: Span
    windows: tuple[Span, ...]

    def to_dict(self) -> dict:
        return {
            "loader": self.loader,
            "samples": self.total.samples,
            "seconds": self.total.end_s,
            "samples_per_s": self.total.samples_per_s,
            "first_batch_s": self.first_batch_s,
            "data_wait_fraction": self.total.data_wait_fraction,
            "windows": [asdict(window) for window in self.windows],
        }


def train_step(batch: Any) -> int:
    """The simulated training step: read every byte of the batch (a sum)."""
    images, labels = batch
    return int(np.asarray(images).sum(dtype=np.uint64)) + int(np.asarray(labels).sum())


class _LoopClock:
    """One loader's training loop, timed: its own epochs only, in windows
    of about ``WINDOW_S``; ``on_window(span)`` is called as each closes."""

    def __init__(self, name: str, on_window: Optional[Callable[[Span], Any]]):
        self.name, self._on_window = name, on_window
        self._elapsed_s = self._epoch_began = 0.0
        self.first_batch_s: Optional[float] = None
        self.windows: list[Span] = []
        self._open = Span(0.0, 0.0, 0, 0.0)  # the window being filled (its end_s is set when it closes)

    def now(self) -> float:
        return self._elapsed_s + perf_counter() - self._epoch_began

    def epoch(self, batches: Iterable) -> None:
        """One epoch: ``iter()``, then ``next()`` and :func:`train_step` per batch."""
        self._epoch_began = perf_counter()
        iterator = self._wait(iter, batches)
        while (batch := self._wait(next, iterator, None)) is not None:
            self._delivered(len(batch[1]))
            train_step(batch)
        self._elapsed_s = self.now()

    def _wait(self, call: Callable[..., Any], *args: Any) -> Any:
        began = perf_counter()
        value = call(*args)
        self._open = replace(self._open, wait_s=self._open.wait_s + perf_counter() - began)
        return value

    def _delivered(self, samples: int) -> None:
        now = self.now()
        if self.first_batch_s is None:
            self.first_batch_s = now
        self._open = replace(self._open, samples=self._open.samples + samples)
        if now - self._open.start_s >= WINDOW_S:
            self.windows.append(replace(self._open, end_s=now))
            self._open = Span(now, now, 0, 0.0)
            if self._on_window is not None:
                self._on_window(self.windows[-1])

    def result(self) -> RunResult:
        """The windows and their sum; a last short window joins the one
        before it (a few prefetched batches at once make a spike, not a rate)."""
        last = replace(self._open, end_s=self._elapsed_s)
        if self.windows and last.end_s - last.start_s < WINDOW_S / 2:
            last = self.windows.pop() + last
        if last.end_s > last.start_s:
            self.windows.append(last)
        total = sum(self.windows[1:], self.windows[0]) if self.windows else last
        return RunResult(self.name, self.first_batch_s or 0.0, total, tuple(self.windows))


@dataclass(frozen=True)
class Side:
    """A loader in the race: its name, its batches for epoch ``e``, and what to tell per window."""

    name: str
    batches: Callable[[int], Iterable]
    on_window: Optional[Callable[[Span], Any]] = None


def race(sides: list[Side], epochs: int) -> list[RunResult]:
    """The same loop for every side, their epochs taking turns (one of the
    first, one of the second, ...) so that a change in the machine's load
    falls on all of them alike."""
    clocks = [_LoopClock(side.name, side.on_window) for side in sides]
    for epoch in range(epochs):
        for side, clock in zip(sides, clocks):
            clock.epoch(side.batches(epoch))
    return [clock.result() for clock in clocks]


# ------------------------------------------------------------- the two loaders
def _loader_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments both loaders get."""
    return {
        "batch_size": args.batch_size,
        "shuffle": True,
        "num_workers": args.workers,
        "persistent_workers": args.workers > 0,
    }


def conveyor_dataloader() -> tuple[str, type]:
    """conveyor's DataLoader (torch tensors when torch is installed) and its name."""
    try:
        from ..torch import DataLoader

        return "conveyor.torch", DataLoader
    except ImportError:
        from .. import DataLoader as CoreDataLoader

        return "conveyor", CoreDataLoader


class _TorchBars:
    """A tqdm bar per epoch for torch's loader, which has none of its own;
    it shows the loop's latest window as conveyor's bar shows its own."""

    def __init__(self, loader: Any, enabled: bool):
        self.loader, self.enabled = loader, enabled
        self.bar: Any = None

    def wrap(self, epoch: int) -> Iterable:
        if not self.enabled:
            return self.loader
        from tqdm.auto import tqdm

        self.bar = tqdm(self.loader, desc="torch", unit="batch", dynamic_ncols=True)
        return self.bar

    def show(self, window: Span) -> None:
        if self.bar is not None:
            text = f"{window.samples_per_s:,.0f} samples/s, data wait {window.data_wait_fraction:.0%}"
            self.bar.set_postfix_str(text, refresh=False)


def torch_side(dataset: ImageFolder, args: argparse.Namespace, progress: bool) -> Optional[Side]:
    """``torch.utils.data.DataLoader`` with the same arguments; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    generator = torch.Generator().manual_seed(args.seed)
    # (the ignore: torch's loader reads any map-style dataset; its annotation names its own Dataset class)
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type]
        generator=generator,
        **_loader_arguments(args),
    )
    bars = _TorchBars(loader, progress)
    return Side("torch.utils.data", bars.wrap, bars.show)


def race_both(dataset: ImageFolder, args: argparse.Namespace, progress: bool) -> tuple[list[RunResult], Any]:
    """conveyor against torch (when installed): their runs, and conveyor's
    ``LoaderStats``. The loaders, and so their workers, end on return, when
    torch was imported before (see :func:`run`)."""
    name, DataLoader = conveyor_dataloader()
    loader = DataLoader(dataset, seed=args.seed, progress=progress, **_loader_arguments(args))
    sides = [Side(name, lambda epoch: loader)]
    other = torch_side(dataset, args, progress)
    if other is not None:
        sides.append(other)
    return race(sides, args.epochs), loader.stats()


# ------------------------------------------------------------- the report
def speedup(runs: list[RunResult]) -> Optional[float]:
    """conveyor's samples/s over torch's (None without a torch run)."""
    if len(runs) < 2 or runs[1].total.samples_per_s <= 0:
        return None
    return runs[0].total.samples_per_s / runs[1].total.samples_per_s


def comparison(runs: list[RunResult]) -> str:
    """The runs side by side, and conveyor's speed-up when torch ran too."""
    lines = [f"  {'loader':<20}{'samples/s':>11}{'first batch':>13}{'data wait':>11}{'seconds':>9}"]
    for run in runs:
        lines.append(
            f"  {run.loader:<20}{run.total.samples_per_s:11,.0f}{run.first_batch_s * 1e3:10.0f} ms"
            f"{run.total.data_wait_fraction:11.0%}{run.total.end_s:9.2f}"
        )
    ratio = speedup(runs)
    if ratio is not None:
        lines.append(f"  {runs[0].loader} delivered {ratio:.2f}x the samples/s of {runs[1].loader}")
    elif len(runs) == 1:
        lines.append("  torch is not installed, so conveyor ran alone (pip install 'conveyor[torch]' to compare)")
    return "\n".join(lines)


def write_plot(runs: list[RunResult], path: Path, title: str) -> Optional[str]:
    """Samples/s and data wait per window of each run, as a PNG at ``path``;
    returns why not when matplotlib is missing (None when written)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'conveyor[plots]')"
    figure = Figure(figsize=(9, 6), constrained_layout=True)
    FigureCanvasAgg(figure)  # Agg, without touching pyplot's global backend
    rate, wait = figure.subplots(2, 1, sharex=True)
    for run in runs:
        edges = [0.0, *(w.end_s for w in run.windows)]
        label = f"{run.loader} ({run.total.samples_per_s:,.0f} samples/s)"
        rate.stairs([w.samples_per_s for w in run.windows], edges, baseline=None, label=label, linewidth=2)
        wait.stairs([100 * w.data_wait_fraction for w in run.windows], edges, baseline=None, linewidth=2)
    rate.set(title=title, ylabel="samples/s", ylim=(0, None))
    rate.legend(loc="lower right")
    wait.set(ylabel="data wait (% of the loop's time)", ylim=(0, 105))
    wait.set_xlabel(f"seconds of each loader's loop (steps of about {WINDOW_S} s)")
    for axes in (rate, wait):
        axes.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return None


def _dataset(args: argparse.Namespace) -> ImageFolder:
    if args.data is None:
        root = synthetic_folder()
        if not is_made(root):
            print(f"writing synthetic JPEGs to {root} (once) ...", file=sys.stderr)
        make_synthetic_images(root)
    else:
        root = args.data
    return ImageFolder(root, crop=args.crop)


def run(args: argparse.Namespace) -> int:
    """The demo: the race with bars, then the report as text or JSON, and the plot."""
    dataset = _dataset(args)
    progress = not args.json and importlib.util.find_spec("tqdm") is not None
    setup = f"batch {args.batch_size}, {args.workers} workers, {args.epochs} epochs of {len(dataset):,} images"
    if not args.json:
        print(f"conveyor demo: {_PIPELINE}; {setup}; the same loop for each loader, epochs taking turns", flush=True)
        if not progress:
            print("(no progress bars: pip install tqdm)", flush=True)
    # torch's first import leaves a reference cycle that holds the frames of
    # its importers until the garbage collector runs: import it here, where
    # no frame holds a loader, so that the workers stop when race_both returns.
    conveyor_dataloader()
    runs, stats = race_both(dataset, args, progress)
    plot_note = None if args.no_plot else write_plot(runs, args.plot, f"{_PIPELINE}\n{setup}")
    plot = None if args.no_plot or plot_note else str(args.plot)
    if args.json:
        print(json.dumps(_json_report(args, len(dataset), runs, stats, plot)))
        return 0
    print(f"\n{runs[0].loader}'s own stats, loader.stats().summary():")
    stats.summary()
    print(
        f"\nside by side, timed in the loop (data wait: blocked in iter() or next(); first batch: from the "
        f"first iter(), starting the workers included):\n{comparison(runs)}"
    )
    if plot_note or plot:
        print(plot_note or f"plot: {plot} (samples/s and data wait over time)")
    return 0


def _json_report(args: argparse.Namespace, images: int, runs: list[RunResult], stats: Any, plot: Optional[str]) -> dict:
    return {
        "pipeline": _PIPELINE,
        "images": images,
        "batch_size": args.batch_size,
        "num_workers": args.workers,
        "epochs": args.epochs,
        "conveyor": runs[0].to_dict(),
        "torch": runs[1].to_dict() if len(runs) > 1 else None,
        "speedup": speedup(runs),
        "stats": stats.to_dict(),
        "verdict": str(stats.verdict()),
        "plot": plot,
    }
