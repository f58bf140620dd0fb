"""Locality for shards: bytes downloaded per epoch from an object store with
a small cache, in the block order against a fully random order.

    python bench/locality.py [--shards 200] [--samples 8] [--sample-bytes 2000] [--window 4]
        [--cache-share 0.1] [--epochs 2] [--random-epochs 1] [--workers 2] [--out bench/results-locality.json]

Starts moto's S3 server on 127.0.0.1 behind the proxy of tests/object_store.py
(which counts the bytes of every GET body it sends), packs ``shards``
shards of ``samples`` samples of ``sample-bytes`` random bytes (with their
indexes), uploads them, and reads ``epochs`` epochs (the random order:
``random-epochs``, as each of its epochs costs a download per sample) through a
``ShardDataset(store=..., whole_shards=True)``: each shard fetched whole
into the store's cache (``cache-share`` of the data set's bytes) at its
first read, its samples read from the local copy. Each order starts with an
empty cache:

  block    ShardBlockSampler(shards_per_window=window), ``workers`` worker processes
  stream   ShardDataset.stream(shuffle_shards=True, shards_per_window=window), ``workers`` workers
  random   RandomSampler(seed=0) over the same dataset, ``workers`` worker processes

and records, per epoch, the bytes of shards downloaded (the proxy's count of
GET bodies of .tar objects) against the data set's bytes: the block order
downloads each shard once per epoch (target: at most 1.05× the data set),
the random order once per sample that misses the cache.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
PREFIX = "locality"


def pack(folder: Path, shards: int, samples: int, sample_bytes: int) -> dict[str, bytes]:
    """The shards and their indexes as {object name: bytes}."""
    import numpy as np

    from conveyor.shards import ShardIndex

    rng = np.random.default_rng(0)
    k = 0
    for number in range(shards):
        path = folder / f"shard-{number:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for _ in range(samples):
                data = rng.integers(0, 256, sample_bytes, dtype=np.uint8).tobytes()
                member = tarfile.TarInfo(f"{k:09d}.bin")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                k += 1
        ShardIndex.scan(str(path)).save(str(path) + ".idx")
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def length(sample: dict) -> int:
    return len(sample["bin"])


def read_epochs(order: str, server, args: argparse.Namespace, cache_dir: str, cache_bytes: int) -> list[dict]:
    """Each epoch's downloads and time for one order, from an empty cache."""
    import conveyor
    from conveyor.shards import ShardDataset
    from conveyor.store import Store
    from object_store import BUCKET

    store = Store(f"s3://{BUCKET}", storage_options=server.options(), cache_dir=cache_dir, cache_bytes=cache_bytes)
    dataset = ShardDataset(PREFIX, store=store, transform=length, whole_shards=True)
    if order == "stream":
        stream = dataset.stream(shuffle_shards=True, seed=0, shards_per_window=args.window)
        loader = conveyor.DataLoader(stream, batch_size=32, num_workers=args.workers, collate_fn=len)
    else:
        if order == "block":
            sampler = conveyor.ShardBlockSampler(dataset, shards_per_window=args.window, seed=0)
        else:
            sampler = conveyor.RandomSampler(dataset, seed=0)
        loader = conveyor.DataLoader(dataset, 32, sampler=sampler, num_workers=args.workers, collate_fn=len)
    epochs = []
    for epoch in range(args.random_epochs if order == "random" else args.epochs):
        loader.set_epoch(epoch)
        server.sent_bytes.clear()
        before = len(server.requests)
        start = time.perf_counter()
        count = sum(loader)
        seconds = time.perf_counter() - start
        gets = [path for method, path, _ in server.requests[before:] if method == "GET" and path.endswith(".tar")]
        downloaded = sum(n for path, n in server.sent_bytes.items() if path.endswith(".tar"))
        epochs.append({"samples": count, "downloaded_bytes": downloaded, "shard_gets": len(gets)})
        epochs[-1]["s"] = round(seconds, 2)
        print(f"{order} epoch {epoch}: {downloaded / 2**20:.1f} MB downloaded, {len(gets)} GETs, {seconds:.1f} s")
    store.close()
    return epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--samples", type=int, default=8, help="samples per shard")
    parser.add_argument("--sample-bytes", type=int, default=2000)
    parser.add_argument("--window", type=int, default=4, help="shards_per_window of the block order")
    parser.add_argument("--cache-share", type=float, default=0.1, help="the cache's size, a share of the data set")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--random-epochs", type=int, default=1, help="epochs of the random order")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--orders", default="block,stream,random")
    parser.add_argument("--out", default=str(HERE / "results-locality.json"))
    args = parser.parse_args()

    sys.path.insert(0, str(TESTS))
    import logging

    from object_store import ObjectStore

    logging.getLogger("conveyor").setLevel(logging.ERROR)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # (s3fs's sessions closed on another loop at exit)
    server = ObjectStore.start()
    results: dict = {}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch) / "shards"
            folder.mkdir()
            files = pack(folder, args.shards, args.samples, args.sample_bytes)
            from conveyor.store import Store
            from object_store import BUCKET

            uploader = Store(f"s3://{BUCKET}", storage_options=server.options(), cache_dir=str(Path(scratch) / "up"))
            for name, data in files.items():
                uploader.fs.pipe(uploader.url(f"{PREFIX}/{name}"), data)
            data_bytes = sum(len(data) for name, data in files.items() if name.endswith(".tar"))
            cache_bytes = int(data_bytes * args.cache_share)
            for order in args.orders.split(","):
                results[order] = read_epochs(order, server, args, str(Path(scratch) / f"cache-{order}"), cache_bytes)
    finally:
        server.stop()
    summary = {
        order: {
            "per_epoch_ratio": [round(e["downloaded_bytes"] / data_bytes, 3) for e in epochs],
            "max_ratio": round(max(e["downloaded_bytes"] for e in epochs) / data_bytes, 3),
        }
        for order, epochs in results.items()
    }
    ratios = {f"{order}_to_data_set": summary[order]["max_ratio"] for order in summary}
    if "block" in summary and "random" in summary:
        ratios["random_to_block"] = round(summary["random"]["max_ratio"] / summary["block"]["max_ratio"], 1)
    result = {
        "what": "bench/locality.py: bytes of shards downloaded per epoch from moto's S3 server on 127.0.0.1 "
        "(counted by the proxy in front of it) through ShardDataset(store=..., whole_shards=True), with a cache of "
        f"{args.cache_share:.0%} of the data set, each order from an empty cache",
        "shards": args.shards,
        "samples_per_shard": args.samples,
        "sample_bytes": args.sample_bytes,
        "shards_per_window": args.window,
        "workers": args.workers,
        "epochs": args.epochs,
        "random_epochs": args.random_epochs,
        "data_set_bytes": data_bytes,
        "cache_bytes": cache_bytes,
        "target_block_ratio": 1.05,
        "ratios": ratios,
        "orders": {order: {**summary[order], "epochs": epochs} for order, epochs in results.items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
