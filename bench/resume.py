"""Resume benchmark: time to the first batch after resuming mid-epoch.

    python bench/resume.py [--samples 100000] [--batch-size 64] [--num-workers 2]
                           [--sample-us 20] [--repeats 5] [--fractions 0.1,0.9]

An epoch of ``--samples`` samples, each costing about ``--sample-us`` µs of
CPU (a stand-in for decoding) plus a random augmentation, is interrupted at
each fraction of its batches. Then, in the same run, for each loader:

  conveyor    conveyor.torch.DataLoader: build, load_state_dict, first batch
  torch       torch.utils.data.DataLoader, its only option: build, iterate
              and discard the batches already seen, first batch
  torchdata   torchdata's StatefulDataLoader (when installed): build,
              load_state_dict, first batch
  fresh       conveyor.torch.DataLoader from the start of an epoch, no state
              (what a resume should cost, wherever it resumes)

The states are saved once per fraction, outside the timings. Each timing
builds a new loader (workers included) and is repeated ``--repeats`` times,
alternating loaders; the JSON printed on stdout gives medians in seconds and
the ratios torch/conveyor, torchdata/conveyor (above 1: conveyor resumes
faster) and conveyor/fresh (about 1: resuming costs what starting does).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct


class Decoded:
    """Sample ``i``: 256 float32 values after ``cost_us`` µs of busy CPU work,
    plus noise from numpy's global generator (an augmentation)."""

    def __init__(self, n: int, cost_us: float):
        self.n, self.cost_s = n, cost_us / 1e6
        self.base = np.linspace(0.0, 1.0, 256, dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return self.base + np.float32(i) + np.random.rand(256).astype(np.float32)


def _torchdata() -> Optional[Any]:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return None
    return StatefulDataLoader


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


class Setup:
    def __init__(self, args: argparse.Namespace):
        self.dataset = Decoded(args.samples, args.sample_us)
        self.batch_size = args.batch_size
        self.num_workers = args.num_workers
        self.batches = len(ct.DataLoader(self.dataset, batch_size=args.batch_size))

    def options(self) -> dict:
        return {"batch_size": self.batch_size, "num_workers": self.num_workers, "shuffle": True}

    def conveyor(self) -> Any:
        return ct.DataLoader(self.dataset, seed=0, **self.options())

    def torch(self) -> Any:
        return tud.DataLoader(self.dataset, generator=torch.Generator().manual_seed(0), **self.options())

    def torchdata(self, StatefulDataLoader: Any) -> Any:
        return StatefulDataLoader(self.dataset, generator=torch.Generator().manual_seed(0), **self.options())


def saved_state(build: Callable[[], Any], batches: int) -> Any:
    """The state after ``batches`` batches of the first epoch (not timed)."""
    loader = build()
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    del it, loader
    gc.collect()
    return state


def time_first_batch(start: Callable[[], Any]) -> float:
    """Seconds from nothing to the first batch in hand; ``start`` returns an iterator."""
    gc.collect()
    began = time.perf_counter()
    it = start()
    next(it)
    elapsed = time.perf_counter() - began
    del it
    gc.collect()
    return elapsed


def resumed(build: Callable[[], Any], state: Any) -> Callable[[], Any]:
    def start() -> Any:
        loader = build()
        loader.load_state_dict(state)
        return iter(loader)

    return start


def discarding(build: Callable[[], Any], batches: int) -> Callable[[], Any]:
    def start() -> Any:
        it = iter(build())
        for _ in range(batches):
            next(it)
        return it

    return start


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b == 0 else round(a / b, 2)


def run(args: argparse.Namespace) -> dict:
    setup = Setup(args)
    StatefulDataLoader = _torchdata()
    fractions = [float(f) for f in args.fractions.split(",")]
    results: dict[str, Any] = {}
    for fraction in fractions:
        batches = int(fraction * setup.batches)
        starts: dict[str, Callable[[], Any]] = {
            "fresh": lambda: iter(setup.conveyor()),
            "conveyor": resumed(setup.conveyor, saved_state(setup.conveyor, batches)),
            "torch": discarding(setup.torch, batches),
        }
        if StatefulDataLoader is not None:
            build = lambda: setup.torchdata(StatefulDataLoader)  # noqa: E731
            starts["torchdata"] = resumed(build, saved_state(build, batches))
        times: dict[str, list[float]] = {name: [] for name in starts}
        for _ in range(args.repeats):  # alternate: drift in the machine hits all alike
            for name, start in starts.items():
                times[name].append(time_first_batch(start))
        medians = {f"{name}_s": round(statistics.median(t), 4) for name, t in times.items()}
        medians.setdefault("torchdata_s", None)
        results[f"resume_at_{round(fraction * 100)}pct"] = {
            "batches_skipped": batches,
            **medians,
            "torch_over_conveyor": ratio(medians["torch_s"], medians["conveyor_s"]),
            "torchdata_over_conveyor": ratio(medians["torchdata_s"], medians["conveyor_s"]),
            "conveyor_over_fresh": ratio(medians["conveyor_s"], medians["fresh_s"]),
            "runs_s": {name: [round(x, 4) for x in t] for name, t in times.items()},
        }
    return {
        "benchmark": "resume",
        "unit": "seconds to the first batch after resuming (median); ratios > 1 mean conveyor is faster",
        "config": {
            "samples": args.samples,
            "batch_size": args.batch_size,
            "batches_per_epoch": setup.batches,
            "num_workers": args.num_workers,
            "sample_us": args.sample_us,
            "repeats": args.repeats,
        },
        "results": results,
        "versions": {
            "python": platform.python_version(),
            "conveyor": conveyor.__version__,
            "torch": torch.__version__,
            "torchdata": _version("torchdata") if StatefulDataLoader is not None else "not installed",
        },
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--sample-us", type=float, default=20.0, help="busy CPU time per sample, µs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fractions", default="0.1,0.9", help="where in the epoch to resume, comma-separated")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13
    json.dump(run(args), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
