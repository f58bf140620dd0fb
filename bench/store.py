"""Workload n: samples in an S3-compatible store with 20 ms per request.

    python bench/store.py [--objects 1500] [--latency 0.02] [--rounds 3]

Starts moto's S3 server behind a proxy that delays every request by
``latency`` (tests/object_store.py), in a process of its own, uploads
``objects`` objects of 4 KB, and reads them all once (batch 32) through
fsspec/s3fs with each loader. Samples/s of:

  torch                torch.utils.data, 2 worker processes, one read at a time each
  conveyor_processes   conveyor.torch, 2 worker processes, 8 reads in flight each
  conveyor_threads     conveyor.torch, 8 worker threads, 4 reads in flight each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"

_SERVER = """
import sys, time
sys.path.insert(0, {tests!r})
from object_store import ObjectStore
store = ObjectStore.start()
store.latency_s = {latency!r}
print(store.url, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
store.stop()
"""


def options(url: str) -> dict:
    return {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": url, "region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "max_pool_connections": 64},
    }


def length(data: bytes, path: str) -> int:
    return len(data)


def read_all(kind: str, url: str) -> float:
    import torch.utils.data as tud

    import conveyor.torch as ct
    from conveyor.store import Store, StoreFiles

    dataset = StoreFiles(Store("s3://data", storage_options=options(url)), "objects", transform=length)
    if kind == "torch":
        loader = tud.DataLoader(dataset, batch_size=32, num_workers=2)
    elif kind == "conveyor_processes":
        loader = ct.DataLoader(dataset, batch_size=32, num_workers=2, reads_in_flight=8)
    else:
        loader = ct.DataLoader(dataset, batch_size=32, num_workers=8, worker_method="thread", reads_in_flight=4)
    start, count = time.perf_counter(), 0
    for batch in loader:
        count += len(batch)
    return count / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict:
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER.format(tests=str(TESTS), latency=args.latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().strip()
        from conveyor.store import Store

        store = Store("s3://data", storage_options=options(url))
        for i in range(args.objects):
            store.fs.pipe(store.url(f"objects/{i:06d}.bin"), os.urandom(4096))
        kinds = ("torch", "conveyor_processes", "conveyor_threads")
        results: dict = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                results[kind].append(read_all(kind, url))
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    medians = {kind: round(statistics.median(v), 1) for kind, v in results.items()}
    return {
        "objects": args.objects,
        "latency_s": args.latency,
        "samples_per_s": medians,
        "ratios": {kind: round(medians[kind] / medians["torch"], 2) for kind in kinds[1:]},
        "samples": {kind: [round(v, 1) for v in vs] for kind, vs in results.items()},
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1500)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse_args()), indent=2))
