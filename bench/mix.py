"""Mixing benchmark: samples/s of a 3-source weighted mix, main-process
memory over 10**7 mix positions, and resume time, side by side in one run.

    python bench/mix.py [--samples 200000] [--peers-path DIR] [--out bench/results-mix.json]

Sources: three in-memory map-style datasets (weights 0.6 / 0.3 / 0.1), with
tiny samples (an int) and 4 KiB samples (a uint8 array). Each library mixes
them and yields ``--samples`` samples in batches of 256, num_workers=0:

  conveyor   conveyor.Mix through conveyor.DataLoader (numpy batches), each source read in its
             keyed permutation (shuffle=True) and in its own order (shuffle=False, as the peers read)
  grain      grain's MapDataset.mix(...).batch(256) (when importable)
  hf         datasets.interleave_datasets(probabilities=...) over Dataset.from_dict (when importable)
  litdata    CombinedStreamingDataset(weights=) over StreamingDatasets that litdata.optimize wrote to a
             local folder (a tenth of the lengths), read from there (so its figure includes its chunk reads)
  streaming  MosaicML Streams: skipped where it does not import (the JSON says why)

``--peers-path`` (default: ``.bench-peers``, which ``make bench-peers`` fills,
when it exists) appends a folder of installed peers to sys.path (after this
environment's own packages). Also measured for conveyor: the peak RSS added
while mapping 10**7 positions (flat: no order is stored), and the time to
load a state saved at 90% of the mix and deliver the next batch. Each library is
built once, then timed ``--rounds`` times taking turns; the JSON gives the
median samples/s per library and the ratios conveyor/peer (above 1:
conveyor is faster): ``ratio_conveyor_over_*`` of the in-order mix (the
same work as the peers'), ``ratio_shuffled_conveyor_over_*`` of the
shuffled one.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import conveyor

WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}
LENGTHS = {"web": 60_000, "code": 30_000, "books": 10_000}
BATCH = 256
#: Where `make bench-peers` installs the peers (the default --peers-path when it exists).
DEFAULT_PEERS = Path(__file__).resolve().parent.parent / ".bench-peers"
#: Where litdata's chunks are written (removed at the end of the run).
_SCRATCH: Any = None


def _sources(kind: str) -> dict[str, Any]:
    if kind == "tiny":
        return {name: list(range(n)) for name, n in LENGTHS.items()}
    return {name: np.zeros((n, 4096), dtype=np.uint8) for name, n in LENGTHS.items()}


Run = Callable[[], int]


def _timed(run: Run) -> float:
    start = time.perf_counter()
    count = run()
    return count / (time.perf_counter() - start)


def _conveyor(kind: str, samples: int, shuffle: bool = True) -> Run:
    mix = conveyor.Mix(_sources(kind), weights=WEIGHTS, seed=0, num_samples=samples, shuffle=shuffle)
    loader = conveyor.DataLoader(mix, batch_size=BATCH)
    return lambda: sum(len(b) for b in loader)


def _conveyor_in_order(kind: str, samples: int) -> Run:
    return _conveyor(kind, samples, shuffle=False)


def _grain(kind: str, samples: int) -> Run:
    import grain

    sources = _sources(kind)
    datasets = [grain.MapDataset.source(sources[n]).repeat() for n in WEIGHTS]
    mixed = grain.MapDataset.mix(datasets, weights=list(WEIGHTS.values()))[:samples].batch(BATCH)

    def run() -> int:
        return sum(len(b) for b in mixed)

    return run


def _hf(kind: str, samples: int) -> Run:
    import datasets

    sources = _sources(kind)
    parts = [datasets.Dataset.from_dict({"x": list(sources[n])}) for n in WEIGHTS]
    if kind != "tiny":
        parts = [p.with_format("numpy") for p in parts]
    mixed = datasets.interleave_datasets(
        parts, probabilities=list(WEIGHTS.values()), seed=0, stopping_strategy="all_exhausted"
    )
    take = min(samples, len(mixed))

    def run() -> int:
        count = 0
        for start in range(0, take, BATCH):
            count += len(mixed[start : start + BATCH]["x"])
        return count

    return run


def _litdata_tiny(i: int) -> int:
    return i


def _litdata_4k(i: int) -> np.ndarray:
    return np.full(4096, i % 251, dtype=np.uint8)


def _litdata(kind: str, samples: int) -> Run:
    """litdata's CombinedStreamingDataset over sources written by litdata.optimize to a local folder (a tenth
    of the lengths, to keep the writing short), iterated until the first runs out or ``samples``."""
    import os

    from litdata import CombinedStreamingDataset, StreamingDataset, optimize

    root = tempfile.mkdtemp(prefix="mix-litdata-", dir=_SCRATCH)
    parts = []
    for name, n in LENGTHS.items():
        out = os.path.join(root, name)
        fn = _litdata_tiny if kind == "tiny" else _litdata_4k
        optimize(fn=fn, inputs=list(range(n // 10)), output_dir=out, chunk_bytes="4MB", num_workers=1, mode="overwrite")
        parts.append(StreamingDataset(out))
    mixed = CombinedStreamingDataset(parts, weights=list(WEIGHTS.values()), iterate_over_all=False, seed=0)

    def run() -> int:
        count = 0
        for _ in mixed:
            count += 1
            if count >= samples:
                break
        return count

    return run


def _memory_over_positions(positions: int) -> dict[str, float]:
    mix = conveyor.Mix(_sources("tiny"), weights=WEIGHTS, seed=0, num_samples=positions)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    chunk = 1 << 16
    checkpoints = []
    for start in range(0, positions, chunk):
        mix.locate_many(np.arange(start, min(positions, start + chunk)))
        if start % (chunk * 32) == 0:
            checkpoints.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "positions": positions,
        "peak_rss_added_mib": (after - before) / 1024,
        "rss_added_first_vs_last_checkpoint_mib": (checkpoints[-1] - checkpoints[0]) / 1024,
    }


def _resume(samples: int) -> dict[str, float]:
    def loader() -> conveyor.DataLoader:
        mix = conveyor.Mix(_sources("tiny"), weights=WEIGHTS, seed=0, num_samples=samples)
        return conveyor.DataLoader(mix, batch_size=BATCH, shuffle=True, seed=1)

    first = loader()
    it = iter(first)
    for _ in range(int(0.9 * len(first))):
        next(it)
    state = first.state_dict()
    start = time.perf_counter()
    resumed = loader()
    resumed.load_state_dict(state)
    next(iter(resumed))
    resume_s = time.perf_counter() - start
    start = time.perf_counter()
    next(iter(loader()))
    return {"resume_at_90pct_s": resume_s, "fresh_first_batch_s": time.perf_counter() - start}


def _compare(
    kind: str, samples: int, rounds: int, peers: dict[str, Callable[[str, int], Run]], skipped: dict[str, str]
) -> dict[str, Any]:
    """Each library built once (outside the timings), then timed ``rounds`` times, taking turns; medians."""
    runs: dict[str, Run] = {
        "conveyor": _conveyor(kind, samples),
        "conveyor_in_order": _conveyor_in_order(kind, samples),
    }
    for name, build in peers.items():
        try:
            runs[name] = build(kind, samples)
        except Exception as error:  # (not installed, or fails here: recorded, not fatal)
            skipped[f"{name}.{kind}"] = f"{type(error).__name__}: {error}"[:300]
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in list(runs.items()):
            try:
                rates[name].append(_timed(run))
            except Exception as error:
                skipped[f"{name}.{kind}"] = f"{type(error).__name__}: {error}"[:300]
                del runs[name]
    row: dict[str, Any] = {f"{name}_samples_per_s": statistics.median(r) for name, r in rates.items() if r}
    for name in peers:
        rate = row.get(f"{name}_samples_per_s")
        if rate:
            # The peers read each source in its own order: the like-for-like ratio is conveyor's in-order mix.
            row[f"ratio_conveyor_over_{name}"] = row["conveyor_in_order_samples_per_s"] / rate
            row[f"ratio_shuffled_conveyor_over_{name}"] = row["conveyor_samples_per_s"] / rate
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--positions", type=int, default=10**7)
    parser.add_argument("--peers-path", default=str(DEFAULT_PEERS) if DEFAULT_PEERS.is_dir() else None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.peers_path:
        sys.path.append(args.peers_path)
    peers: dict[str, Callable[[str, int], Run]] = {"grain": _grain, "hf": _hf, "litdata": _litdata}
    skipped = {
        "streaming": "mosaicml-streaming imports torchvision at import, and torchvision's PyPI wheel does not load "
        "against this environment's CPU build of torch (operator torchvision::nms does not exist)"
    }
    results: dict[str, Any] = {
        "samples": args.samples,
        "batch_size": BATCH,
        "weights": WEIGHTS,
        "lengths": LENGTHS,
        "rounds": args.rounds,
    }
    # First, while the process is small: its peak RSS is what the mix's own map adds.
    results["memory"] = _memory_over_positions(args.positions)
    global _SCRATCH
    _SCRATCH = tempfile.mkdtemp(prefix="bench-mix-")
    try:
        for kind in ("tiny", "4k"):
            results[kind] = _compare(kind, args.samples, args.rounds, peers, skipped)
    finally:
        shutil.rmtree(_SCRATCH, ignore_errors=True)
    results["resume"] = _resume(args.samples)
    results["skipped"] = skipped
    results["machine"] = {"python": platform.python_version(), "numpy": np.__version__}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
