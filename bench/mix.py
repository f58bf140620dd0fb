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
  litdata    CombinedStreamingDataset: skipped, it reads litdata.optimize'd chunks from disk only
  streaming  MosaicML Streams: skipped, they read MDS shards from disk only

``--peers-path`` appends a folder of installed peers to sys.path (after this
environment's own packages). Also measured for conveyor: the peak RSS added
while mapping 10**7 positions (flat: no order is stored), and the time to
load a state saved at 90% of the mix and deliver the next batch. The JSON
gives samples/s per library and the ratios conveyor/peer (above 1:
conveyor is faster): ``ratio_conveyor_over_*`` of the in-order mix (the
same work as the peers'), ``ratio_shuffled_conveyor_over_*`` of the
shuffled one.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from typing import Any, Callable

import numpy as np

import conveyor

WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}
LENGTHS = {"web": 60_000, "code": 30_000, "books": 10_000}
BATCH = 256


def _sources(kind: str) -> dict[str, Any]:
    if kind == "tiny":
        return {name: list(range(n)) for name, n in LENGTHS.items()}
    return {name: np.zeros((n, 4096), dtype=np.uint8) for name, n in LENGTHS.items()}


def _timed(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    count = run()
    return count / (time.perf_counter() - start)


def _conveyor(kind: str, samples: int, shuffle: bool = True) -> float:
    mix = conveyor.Mix(_sources(kind), weights=WEIGHTS, seed=0, num_samples=samples, shuffle=shuffle)
    loader = conveyor.DataLoader(mix, batch_size=BATCH)
    return _timed(lambda: sum(len(b) for b in loader))


def _grain(kind: str, samples: int) -> float:
    import grain

    sources = _sources(kind)
    datasets = [grain.MapDataset.source(sources[n]).repeat() for n in WEIGHTS]
    mixed = grain.MapDataset.mix(datasets, weights=list(WEIGHTS.values()))[:samples].batch(BATCH)

    def run() -> int:
        return sum(len(b) for b in mixed)

    return _timed(run)


def _hf(kind: str, samples: int) -> float:
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

    return _timed(run)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--positions", type=int, default=10**7)
    parser.add_argument("--peers-path", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.peers_path:
        sys.path.append(args.peers_path)
    peers: dict[str, Callable[[str, int], float]] = {"grain": _grain, "hf": _hf}
    skipped = {
        "litdata": "CombinedStreamingDataset reads litdata.optimize'd chunks from disk only; not set up here",
        "streaming": "MosaicML Streams read MDS shards from disk only; not set up here",
    }
    results: dict[str, Any] = {"samples": args.samples, "batch_size": BATCH, "weights": WEIGHTS, "lengths": LENGTHS}
    # First, while the process is small: its peak RSS is what the mix's own map adds.
    results["memory"] = _memory_over_positions(args.positions)
    for kind in ("tiny", "4k"):
        row: dict[str, Any] = {
            "conveyor_samples_per_s": _conveyor(kind, args.samples),
            "conveyor_in_order_samples_per_s": _conveyor(kind, args.samples, shuffle=False),
        }
        for name, run in peers.items():
            try:
                rate = run(kind, args.samples)
            except Exception as error:  # (not installed, or fails here: recorded, not fatal)
                skipped[f"{name}.{kind}"] = f"{type(error).__name__}: {error}"[:300]
                continue
            row[f"{name}_samples_per_s"] = rate
            # The peers read each source in its own order: the like-for-like ratio is conveyor's in-order mix.
            row[f"ratio_conveyor_over_{name}"] = row["conveyor_in_order_samples_per_s"] / rate
            row[f"ratio_shuffled_conveyor_over_{name}"] = row["conveyor_samples_per_s"] / rate
        results[kind] = row
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
