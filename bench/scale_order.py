"""Shuffling at scale: conveyor's computed order against stored orders, side by side.

    python bench/scale_order.py [--sizes 1e6,1e8,1e10] [--peers /tmp/peers] [--out bench/results-scale-order.json]

For each dataset size ``n`` (a map-style dataset whose item ``i`` is ``i``,
holding nothing of its size) and each subject, one fresh Python process
measures:

* ``memory_mb``: the growth of the process's peak RSS (``ru_maxrss``) from
  just before the sampler is built to just after its first 256 indices:
  what the order costs the main process (a stored permutation, its draw's
  temporaries; nothing of ``n`` for a computed one);
* ``first_indices_s``: building the sampler and drawing its first 256
  indices;
* ``first_batch_s`` (loaders only): ``DataLoader(batch_size=256,
  num_workers=2, shuffle=True)`` built, workers started, first batch;
* ``resume_s``: from a state 90% into the epoch to the first batch of
  indices after it (``load_state_dict`` + first batch). conveyor loads a
  loader state (``num_workers=0``: the order's part of a resume, without
  worker start-up) and, beside it, a sampler state; torch's samplers have
  no state, so their figure is what any resume of them costs at least:
  drawing the epoch's permutation again and indexing it at 90%;
* ``state_bytes``: the JSON of the sampler's state (and of the loader's);
* timings past the first draw are medians of 5 runs (one run where the
  first took a second or more);
* ``indices_per_s``: indices handed out per second by iterating the
  sampler as a loader does (Python ints, one at a time), over a few
  hundred thousand indices, and, for conveyor's computed order, by
  ``KeyedPermutation.block`` (numpy, in blocks).

Subjects: conveyor's ``RandomSampler`` with ``order="computed"`` and
``order="stored"``, conveyor's ``DistributedSampler`` (2 ranks, rank 0)
computed and stored; torch's ``RandomSampler`` and ``DistributedSampler``;
Grain's ``index_shuffle`` (its O(1)-memory keyed permutation: one call per
index, which is how its Python binding is called); MosaicML Streaming's
``get_shuffle_py1e`` (the sample order its ``StreamingDataset`` draws per
epoch, over shards of 100 000 samples, as an array). A subject that cannot
run at a size on this machine (an order of ``n`` int64 past its memory) is
listed under ``skipped`` with the reason. Grain and Streaming are imported
from ``--peers`` when they are not installed (default ``.bench-peers``,
which ``make bench-peers`` fills); only their permutation modules are
loaded, not their whole packages.

The JSON gives each figure per subject and size, and ratios: torch's,
Grain's and Streaming's figure over conveyor's computed one (above 1:
conveyor is lower in memory and time, or, for ``indices_per_s``, conveyor's
over the peer's: above 1, conveyor is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
BATCH = 256
#: Indices drawn one at a time for indices_per_s (per subject and size).
ITERATED = 300_000
#: Indices mapped through KeyedPermutation.block for the vectorised rate.
BLOCKED = 1 << 22
#: How Grain and Streaming were reached (the JSON says it).
PEERS_NOTE = (
    "Grain's index_shuffle and Streaming's get_shuffle_py1e imported from an installed package, else from "
    "{peers} (make bench-peers), their modules "
    "loaded by file without their packages' other imports"
)
#: Runs of a timing whose first run is quicker than QUICK_S (the median is reported).
REPEATS = 5
QUICK_S = 1.0
#: A subject's process may take this long before it is reported as failed.
CHILD_TIMEOUT_S = 600

#: subject -> the sizes it runs at (None: all) and, for the others, why it is skipped.
SUBJECTS = {
    "conveyor_computed": None,
    "conveyor_stored": {10**10: "a stored permutation of 10**10 int64 indices needs 80 GB"},
    "conveyor_distributed_computed": None,
    "conveyor_distributed_stored": {
        10**8: "a stored DistributedSampler order of 10**8 is a Python list of about 5 GB, slow to "
        "build: measured at 10**6 only to keep the run short (the issue's figure at 2*10**7: 50.7 bytes an index)",
        10**10: "a Python list of 10**10 indices needs about 500 GB",
    },
    "torch_random": {10**10: "torch.randperm(10**10) needs 80 GB (int64); this machine has 24 GiB"},
    "torch_distributed": {
        10**8: "torch's DistributedSampler builds a list of 10**8 Python ints (about 5 GB): measured at "
        "10**6 only to keep the run short",
        10**10: "a list of 10**10 Python ints needs about 500 GB",
    },
    "grain_index_shuffle": None,
    "streaming_py1e": {10**10: "get_shuffle_py1e returns the epoch's order as an int64 array: 80 GB at 10**10"},
}


# ------------------------------------------------------------------ in the child process


class Length:
    """A map-style dataset of ``n`` items, ``i`` itself, holding nothing of ``n``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(action: Callable[[], Any]) -> float:
    """Seconds ``action()`` takes: the median of ``REPEATS`` runs, or the
    one run when it took ``QUICK_S`` or more (a stored order of 10**8 is
    drawn once)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
        if times[0] >= QUICK_S:
            break
    return statistics.median(times)


def rate(indices: Any, count: int) -> float:
    """Indices per second handed out by ``indices``, its first draw (a
    stored order's permutation) left out: that is ``first_indices_s``."""
    it = iter(indices)
    next(it)
    start = time.perf_counter()
    for _ in range(count):
        next(it)
    return count / (time.perf_counter() - start)


def load_peer(peers: str, dotted: str, file: str) -> Any:
    """A peer's module by file, its package left unimported (their
    packages import much this benchmark does not need)."""
    import importlib.machinery
    import importlib.util
    import types

    parts = dotted.split(".")
    for depth in range(1, len(parts)):  # empty packages over the file, so its own imports resolve
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(peers, *parts[:depth])]
            sys.modules[name] = package
    path = os.path.join(peers, file)
    loader = importlib.machinery.ExtensionFileLoader(dotted, path) if path.endswith(".so") else None
    spec = importlib.util.spec_from_file_location(dotted, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[dotted] = module
    spec.loader.exec_module(module)
    return module


def conveyor_sampler(subject: str, n: int) -> Any:
    import conveyor

    order = "computed" if subject.endswith("computed") else "stored"
    if "distributed" in subject:
        return conveyor.DistributedSampler(Length(n), num_replicas=2, rank=0, seed=0, order=order)
    return conveyor.RandomSampler(Length(n), seed=0, order=order)


def measure_conveyor(subject: str, n: int) -> dict:
    import conveyor
    from conveyor.sampler.permutation import KeyedPermutation
    from conveyor.state._encoding import checksum  # (to seal the hand-made state at 90%, as state_dict seals)

    out: dict[str, Any] = {}
    before, start = rss_mb(), time.perf_counter()
    sampler = conveyor_sampler(subject, n)
    batches = conveyor.BatchSampler(sampler, BATCH, False)
    first = next(iter(batches))
    out["first_indices_s"] = time.perf_counter() - start
    out["memory_mb"] = max(0.0, peak_rss_mb() - before)
    out["order"] = sampler.order
    assert len(first) == BATCH
    state = json.loads(json.dumps(batches.state_dict()))
    out["state_bytes"] = len(json.dumps(state))
    # a sampler state 90% into the epoch
    share = len(sampler)
    at = share // BATCH * 9 // 10
    state["position"] = at
    state["sampler"]["position"] = at * BATCH

    def resume_sampler() -> None:
        resumed = conveyor.BatchSampler(conveyor_sampler(subject, n), BATCH, False)
        resumed.load_state_dict(state)
        next(iter(resumed))

    out["resume_sampler_s"] = timed(resume_sampler)
    out["indices_per_s"] = rate(conveyor_sampler(subject, n), ITERATED)
    if subject.endswith("computed") and "distributed" not in subject:
        permutation, count = KeyedPermutation(n, 1), min(n, BLOCKED)
        start = time.perf_counter()
        for first_position in range(0, count, 1 << 16):
            permutation.block(first_position, min(count, first_position + (1 << 16)))
        out["block_indices_per_s"] = count / (time.perf_counter() - start)

    # the loader: 2 workers to the first batch; then a loader state at 90%, resumed in-process
    def first_batch() -> None:
        loader = conveyor.DataLoader(Length(n), batch_size=BATCH, sampler=conveyor_sampler(subject, n), num_workers=2)
        it = iter(loader)
        next(it)
        del it  # (its workers stop)

    out["first_batch_s"] = timed(first_batch)
    loader = conveyor.DataLoader(Length(n), batch_size=BATCH, sampler=conveyor_sampler(subject, n))
    it = iter(loader)
    next(it)
    saved = json.loads(json.dumps(loader.state_dict()))
    del it
    out["loader_state_bytes"] = len(json.dumps(saved))
    saved["position"] = at
    saved["sampler"]["position"] = at
    saved["sampler"]["sampler"]["position"] = at * BATCH
    saved["checksum"] = checksum(saved)

    def resume() -> None:
        again = conveyor.DataLoader(Length(n), batch_size=BATCH, sampler=conveyor_sampler(subject, n))
        again.load_state_dict(saved)
        assert len(next(iter(again))) == BATCH

    out["resume_s"] = timed(resume)
    return out


def measure_torch(subject: str, n: int) -> dict:
    import torch
    import torch.utils.data as tud

    def make() -> Any:
        if subject == "torch_distributed":
            return tud.DistributedSampler(Length(n), num_replicas=2, rank=0, seed=0)
        return tud.RandomSampler(Length(n), generator=torch.Generator().manual_seed(0))

    out: dict[str, Any] = {}
    before, start = rss_mb(), time.perf_counter()
    batches = tud.BatchSampler(make(), BATCH, False)
    first = next(iter(batches))
    out["first_indices_s"] = time.perf_counter() - start
    out["memory_mb"] = max(0.0, peak_rss_mb() - before)
    assert len(first) == BATCH
    out["state_bytes"] = None  # (torch's samplers have no state)
    del batches, first
    # a resume of a sampler without state: its epoch drawn again, which the draw of its first index pays for
    out["resume_s"] = timed(lambda: next(iter(make())))
    out["indices_per_s"] = rate(make(), ITERATED)

    def first_batch() -> None:
        it = iter(tud.DataLoader(Length(n), batch_size=BATCH, sampler=make(), num_workers=2))
        next(it)
        del it

    out["first_batch_s"] = timed(first_batch)
    return out


def measure_grain(n: int, peers: str) -> dict:
    try:
        import grain._src.python.experimental.index_shuffle.python.index_shuffle_module as module
    except ImportError:
        module = load_peer(
            peers,
            "grain._src.python.experimental.index_shuffle.python.index_shuffle_module",
            "grain/_src/python/experimental/index_shuffle/python/index_shuffle_module.so",
        )
    shuffle = module.index_shuffle
    out: dict[str, Any] = {"note": "index_shuffle(index, max_index, seed, rounds): one call per index; rounds=4"}
    before, start = rss_mb(), time.perf_counter()
    first = [shuffle(i, n - 1, 0, 4) for i in range(BATCH)]
    out["first_indices_s"] = time.perf_counter() - start
    out["memory_mb"] = max(0.0, peak_rss_mb() - before)
    assert all(0 <= i < n for i in first)
    out["state_bytes"] = None  # (a position and a seed: Grain's samplers keep those in their own state)
    at = n * 9 // 10
    out["resume_s"] = timed(lambda: [shuffle(at + i, n - 1, 0, 4) for i in range(BATCH)])
    start = time.perf_counter()
    for i in range(ITERATED):
        shuffle(i, n - 1, 0, 4)
    out["indices_per_s"] = ITERATED / (time.perf_counter() - start)
    return out


def measure_streaming(n: int, peers: str) -> dict:
    try:
        from streaming.base.shuffle.py1e import get_shuffle_py1e
    except ImportError:
        load_peer(peers, "streaming.base.shuffle.py1s", "streaming/base/shuffle/py1s.py")
        get_shuffle_py1e = load_peer(
            peers, "streaming.base.shuffle.py1e", "streaming/base/shuffle/py1e.py"
        ).get_shuffle_py1e
    import numpy as np

    shard = 100_000
    sizes = np.full(n // shard, shard, dtype=np.int64)
    if n % shard:
        sizes = np.append(sizes, n % shard)
    out: dict[str, Any] = {"note": f"get_shuffle_py1e over shards of {shard}, 1 canonical node, block_size 262144"}
    before, start = rss_mb(), time.perf_counter()
    order = get_shuffle_py1e(sizes, 1, 0, 0, 1 << 18)
    first = order[:BATCH].tolist()
    out["first_indices_s"] = time.perf_counter() - start
    out["memory_mb"] = max(0.0, peak_rss_mb() - before)
    assert len(first) == BATCH
    out["state_bytes"] = None  # (StreamingDataset saves the epoch and the samples seen; the order is drawn again)
    at = n * 9 // 10
    out["resume_s"] = timed(lambda: get_shuffle_py1e(sizes, 1, 0, 0, 1 << 18)[at : at + BATCH].tolist())
    out["indices_per_s"] = rate(iter(order[: ITERATED + 1].tolist()), ITERATED)
    return out


def child(subject: str, n: int, peers: str) -> dict:
    if subject.startswith("conveyor"):
        return measure_conveyor(subject, n)
    if subject.startswith("torch"):
        return measure_torch(subject, n)
    if subject == "grain_index_shuffle":
        return measure_grain(n, peers)
    return measure_streaming(n, peers)


# ------------------------------------------------------------------ the run


def run_child(subject: str, n: int, peers: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, __file__, "--child", subject, str(n), "--peers", peers]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {CHILD_TIMEOUT_S} s"}
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(results: dict, n: int) -> dict:
    """Per subject: its figure over conveyor's computed one (indices_per_s:
    conveyor's over the subject's), so above 1 is conveyor ahead. Like is
    compared with like: a peer's resume (an index computed, or an order
    drawn again, at 90%) with conveyor's sampler resume (``resume_sampler_s``);
    conveyor's stored order's loader resume with the computed one's."""
    mine = results["conveyor_computed"].get(str(n), {})
    out: dict[str, dict] = {}
    for subject, by_size in results.items():
        theirs = by_size.get(str(n))
        if subject == "conveyor_computed" or not theirs or "error" in theirs:
            continue
        entry = {}
        pairs = {"memory_mb": "memory_mb", "first_indices_s": "first_indices_s", "first_batch_s": "first_batch_s"}
        pairs["resume_s"] = "resume_s" if subject.startswith("conveyor") else "resume_sampler_s"
        for key, my_key in pairs.items():
            if theirs.get(key) is not None and mine.get(my_key):
                entry[key] = round(theirs[key] / mine[my_key], 2)
        if theirs.get("indices_per_s") and mine.get("indices_per_s"):
            entry["indices_per_s"] = round(mine["indices_per_s"] / theirs["indices_per_s"], 2)
        out[subject] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1e6,1e8,1e10", help="dataset sizes, comma-separated")
    parser.add_argument(
        "--peers", default=str(ROOT / ".bench-peers"), help="a folder Grain and Streaming were installed into"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results-scale-order.json")
    parser.add_argument("--child", nargs=2, metavar=("SUBJECT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.peers)))
        return 0
    sizes = [int(float(size)) for size in args.sizes.split(",")]
    results: dict[str, dict] = {subject: {} for subject in SUBJECTS}
    skipped: dict[str, dict] = {}
    started, load_before = time.perf_counter(), os.getloadavg()
    for n in sizes:
        for subject, skips in SUBJECTS.items():
            if skips and n in skips:
                skipped.setdefault(subject, {})[str(n)] = skips[n]
                continue
            results[subject][str(n)] = run_child(subject, n, args.peers)
            print(f"{subject} n={n}: {results[subject][str(n)]}", file=sys.stderr, flush=True)
    import numpy as np
    import torch

    from conveyor.sampler.order import COMPUTED_ABOVE

    data = {
        "benchmark": "scale_order",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "platform": platform.platform(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            # (the machine's 1-minute load average before and after the run: other work skews the figures)
            "load_average": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        },
        "batch_size": BATCH,
        "workers_for_first_batch": 2,
        "computed_above": COMPUTED_ABOVE,
        "default_order": {str(n): "computed" if n > COMPUTED_ABOVE else "stored" for n in sizes},
        "targets": {"memory_mb_at_1e10": 50, "first_batch_s_at_1e10": 1.0, "resume_s": 0.010},
        "results": results,
        "skipped": skipped,
        "peers": PEERS_NOTE.format(peers=args.peers),
        "ratios": {str(n): ratios(results, n) for n in sizes},
        "run_s": round(time.perf_counter() - started, 1),
    }
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
