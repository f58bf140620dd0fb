"""Per-batch overhead of Ray actor workers against local worker processes,
side by side in one run, on this machine (a local Ray instance).

    python bench/ray_workers.py [--rounds 3] [--workers 2] [--small-batches 400] [--big-batches 60]

Two workloads whose samples cost nothing to make, so that what is timed is
what it costs to get a batch from a worker to the loop:

  * small: 32 int64 scalars a batch (a few hundred bytes);
  * big: 8 samples of 1 MiB float32 a batch (8 MiB).

Rounds alternate ``worker_method="multiprocessing"`` and ``"ray"``, each
with a fresh loader; the first batch (start-up) is timed apart from the
rest. The JSON on stdout gives, per workload and method, the median seconds
per batch after the first and the median start-up, and the ratio ray /
processes. Measured on one node: the object store's zero-copy same-node
path; a batch from another node adds its transfer (docs/scale-out.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import conveyor
from workloads import Ints  # (bench/workloads.py; this script's folder is first on sys.path, and the actors get it)


class Big(conveyor.Dataset):
    """1 MiB of float32 per sample, made once per worker and handed out again."""

    def __init__(self, n: int):
        self.n = n
        self._sample = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self._sample is None:
            self._sample = np.ones(1 << 18, dtype=np.float32)
        return self._sample


def one_pass(dataset, batch_size: int, workers: int, method: str) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds per batch after it, batches)."""
    started = time.perf_counter()
    it = iter(conveyor.DataLoader(dataset, batch_size=batch_size, num_workers=workers, worker_method=method))
    next(it)
    first = time.perf_counter() - started
    started, count = time.perf_counter(), 0
    for _ in it:
        count += 1
    return first, (time.perf_counter() - started) / max(count, 1), count + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--small-batches", type=int, default=400)
    parser.add_argument("--big-batches", type=int, default=60)
    args = parser.parse_args()

    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=max(4, args.workers), include_dashboard=False, log_to_driver=False, configure_logging=False)
    workloads = {
        "small": (Ints(32 * args.small_batches), 32, "32 int64 scalars"),
        "big": (Big(8 * args.big_batches), 8, "8 x 1 MiB float32"),
    }
    methods = ("multiprocessing", "ray")
    results: dict = {}
    try:
        for name, (dataset, batch_size, what) in workloads.items():
            runs: dict = {method: [] for method in methods}
            for _ in range(args.rounds):
                for method in methods:
                    runs[method].append(one_pass(dataset, batch_size, args.workers, method))
            entry: dict = {"batch": what, "batches": runs[methods[0]][0][2]}
            for method in methods:
                entry[method] = {
                    "per_batch_s": statistics.median(r[1] for r in runs[method]),
                    "first_batch_s": statistics.median(r[0] for r in runs[method]),
                    "per_batch_s_all": [r[1] for r in runs[method]],
                }
            entry["ray_over_processes_per_batch"] = (
                entry["ray"]["per_batch_s"] / entry["multiprocessing"]["per_batch_s"]
            )
            entry["ray_extra_per_batch_s"] = entry["ray"]["per_batch_s"] - entry["multiprocessing"]["per_batch_s"]
            results[name] = entry
    finally:
        ray.shutdown()
    machine = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "ray": ray.__version__,
        "numpy": np.__version__,
    }
    print(
        json.dumps({"workers": args.workers, "rounds": args.rounds, "machine": machine, "workloads": results}, indent=2)
    )


if __name__ == "__main__":
    main()
