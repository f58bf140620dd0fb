"""Workload m: many small files, as loose files and packed into shards, read
with a cold page cache.

    python bench/shards.py [--files 20000] [--size 8192] [--rounds 3] [--json]

Makes ``files`` files of ``size`` random bytes in ``root/<class>/``, packs
them with ``conveyor pack`` (shards of 64 MB), then reads every sample once
in a shuffled order (batch 64, 2 workers, raw bytes, no decoding: the
storage is what is measured), the page cache of every file and shard dropped
before each run (posix_fadvise DONTNEED). Samples/s of:

  torch_files     torch.utils.data over the loose files (one open per sample)
  conveyor_files  conveyor.torch over the loose files
  conveyor_shards conveyor.torch over conveyor.shards.ShardDataset (one pread per sample
                  from a bounded table of open files)
  conveyor_stream the shards read whole, in a shuffled shard order (ShardDataset.stream)

and what the checks of every read cost (``checks``): ShardDataset.raw per
sample with and without the tar header checks, page cache warm, CPU time
of this process (µs), and the difference per member.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


class LooseFiles:
    """Sample ``i``: the bytes of the ``i``-th file (and its class)."""

    def __init__(self, root: str):
        base = Path(root)
        self.files = [(str(p), label) for label, c in enumerate(sorted(base.iterdir())) for p in sorted(c.iterdir())]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path, label = self.files[i]
        with open(path, "rb") as f:
            return len(f.read()), label


def shard_sample(sample: dict):
    return len(sample["bin"]), sample["cls"]


def drop_cache(paths) -> None:
    """Ask the kernel to forget the cached pages of ``paths`` (written back
    first: a dirty page is not dropped)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_files(root: Path, files: int, size: int) -> None:
    rng = np.random.default_rng(0)
    for n in range(files):
        folder = root / f"c{n % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{n:07d}.bin").write_bytes(rng.bytes(size))


def read_all(kind: str, root: str, shards: str) -> float:
    import torch.utils.data as tud

    import conveyor.torch as ct
    from conveyor.shards import ShardDataset

    collate = tud.default_collate
    if kind == "torch_files":
        loader = tud.DataLoader(LooseFiles(root), batch_size=64, shuffle=True, num_workers=2, collate_fn=collate)
    elif kind == "conveyor_files":
        loader = ct.DataLoader(LooseFiles(root), batch_size=64, shuffle=True, num_workers=2, seed=0)
    elif kind == "conveyor_shards":
        loader = ct.DataLoader(
            ShardDataset(shards, transform=shard_sample), batch_size=64, shuffle=True, num_workers=2, seed=0
        )
    else:
        stream = ShardDataset(shards, transform=shard_sample).stream(shuffle_shards=True, seed=0)
        loader = ct.DataLoader(stream, batch_size=64, num_workers=2)
    start, count = time.perf_counter(), 0
    for sizes, _ in loader:
        count += len(sizes)
    return count / (time.perf_counter() - start)


def check_cost(shards: str, repeats: int = 5) -> dict:
    """µs of CPU per sample of ShardDataset.raw over every sample (shuffled,
    page cache warm), with its checks and with the header check left out."""
    import random

    import conveyor.shards.dataset as reading
    from conveyor.shards import ShardDataset

    dataset = ShardDataset(shards)
    order = list(range(len(dataset)))
    random.Random(0).shuffle(order)
    members = sum(len(index.offsets) for index in dataset.indexes) / len(dataset)

    def per_sample() -> float:
        for i in order:  # (a first pass maps the shards and warms the cache)
            dataset.raw(i)
        times = []
        for _ in range(repeats):
            start = time.process_time()
            for i in order:
                dataset.raw(i)
            times.append((time.process_time() - start) / len(order) * 1e6)
        return statistics.median(times)

    checked = per_sample()
    real = reading.header_problem
    reading.header_problem = lambda *args: None
    try:
        unchecked = per_sample()
    finally:
        reading.header_problem = real
    return {
        "raw_us_per_sample": round(checked, 2),
        "raw_unchecked_us_per_sample": round(unchecked, 2),
        "members_per_sample": round(members, 2),
        "check_us_per_member": round((checked - unchecked) / members, 2),
    }


def run(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from conveyor.cli import main as cli

    kinds = ("torch_files", "conveyor_files", "conveyor_shards", "conveyor_stream")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root, shards = Path(tmp) / "files", Path(tmp) / "shards"
        make_files(root, args.files, args.size)
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # (its summary line would break --json output)
            cli(["pack", str(root), str(shards), "--max-bytes", "64M", "--workers", "2"])
        pack_s = time.perf_counter() - started
        paths = [str(p) for p in root.rglob("*.bin")] + [str(p) for p in shards.glob("*.tar")]
        results: dict = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                drop_cache(paths)
                results[kind].append(read_all(kind, str(root), str(shards)))
        checks = check_cost(str(shards))
    medians = {kind: round(statistics.median(v), 1) for kind, v in results.items()}
    return {
        "files": args.files,
        "bytes_per_file": args.size,
        "pack_s": round(pack_s, 2),
        "samples_per_s": medians,
        "shards_vs_files": round(medians["conveyor_shards"] / medians["conveyor_files"], 2),
        "stream_vs_torch_files": round(medians["conveyor_stream"] / medians["torch_files"], 2),
        "samples": {kind: [round(v, 1) for v in vs] for kind, vs in results.items()},
        "checks": checks,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    report = run(parse_args())
    print(json.dumps(report, indent=2))
