"""Benchmarks: conveyor and torch.utils.data side by side, in one run.

    python bench/run.py [--json] [--rounds N] [--only a,b,...]

Each workload runs for conveyor (``conveyor.torch``, tensors out, as a torch
user would switch) and for torch.utils.data, alternating A B A B, each round
with a fresh loader; the report gives medians and the ratio conveyor/torch
(higher is better for rates, lower for times and memory). The machine's own
limits are measured too, so each result can be read against what the
hardware allows.

Workloads:
  a  big batches: 64 x 3x224x224 uint8 samples made fresh, 2 workers; the
     consumer copies every byte of each batch (as a copy to a GPU would). GB/s.
  b  small batches: int samples, batch 32, 2 workers. batches/s.
  c  image pipeline: JPEG decode, random crop, flip (Pillow), batch 32,
     2 workers. samples/s. Its ceiling on two cores: twice the rate of the
     same pipeline in one process without a loader, measured in the run.
  d  time to the first batch under spawn, in a fresh script that imports torch. s.
  e  peak memory of (a): resident memory of the main process plus workers,
     sampled every 10 ms. MB.
  f  resume: time to the first batch after resuming at 10% and 90% of an
     epoch of 100,000 samples, against torch's only way (iterate and discard)
     and torchdata's StatefulDataLoader when installed (bench/resume.py).
  g  torch-op augmentations: a synthetic uint8 image made in __getitem__,
     random resized crop (F.interpolate to 224), flip, to float, normalize,
     batch 32, 2 workers (fork); the main process keeps torch's default
     thread count, as a training script does. samples/s.
  i  data-parallel: 2 ranks under torchrun (gloo), each with its own loader
     and 1 worker, an all-reduce after every batch (bench/distributed.py).
     batches/s per rank.
  j  reads that wait: each sample waits 20 ms (a remote read), batch 32,
     torch with 2 workers; conveyor with 2 worker processes reading 8
     samples at a time (reads_in_flight=8), one after another, and with 8
     worker threads reading 4 at a time (worker_method="thread"); each
     against its limit (reads in flight / 20 ms). samples/s.
  k  memory of a dataset holding 5 million file names in a Python list, and
     in a conveyor.CompactList, read by 2 forked workers: PSS growth of the
     job over an epoch (bench/list_memory.py). MB.
  l  one 2 GB sample per batch (made anew), 4 batches, 2 workers; the
     consumer reads a byte of every page. Seconds from iter() to the end
     (after one unmeasured run of each).
  m  20,000 files of 8 KB, loose and packed into shards (conveyor pack), read
     once in a shuffled order with a cold page cache, 2 workers: torch and
     conveyor over the files, conveyor over ShardDataset, and the shards
     streamed whole (bench/shards.py). samples/s.
  n  600 objects of 4 KB in an S3-compatible store (moto's server on
     127.0.0.1, in a process of its own) with 20 ms per request, read through
     fsspec/s3fs: torch with 2 workers; conveyor with 2 processes x 8 reads
     in flight, and 8 threads x 4 (bench/store.py). samples/s.
  o  kept leaves: the memory that keeping one leaf of every batch holds (a
     512-byte label beside 3 MB of images; a 144 KiB mask beside them),
     conveyor against torch (bench/kept_leaves.py; its cost on big batches
     needs a checkout to compare with: kept_leaves.py --before SRC). MB.
  h  the cost of stats: (b) through conveyor with collect_stats on and off,
     10,000 batches a run, twice the rounds (the difference is small, the
     noise is not): batches/s ("overhead": 1 - the median of each round's
     on/off), and CPU microseconds per batch of the main process and its
     workers together ("overhead": that median on/off - 1), a figure the
     scheduling noise of a shared machine moves less.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402  (bench/workloads.py: datasets shared with child scripts)


def _loader(kind: str, dataset, **kwargs):
    if kind == "torch":
        import torch.utils.data as tud

        return tud.DataLoader(dataset, **kwargs)
    import conveyor.torch as ct

    return ct.DataLoader(dataset, **kwargs)


# ----------------------------------------------------------------- workloads


def run_big(kind: str, batches: int) -> float:
    """GB/s of 64x3x224x224 uint8 batches, consumer copying every byte."""
    loader = _loader(kind, workloads.FreshImages(64 * (batches + 1)), batch_size=64, num_workers=2)
    out = np.empty((64, 3, 224, 224), np.uint8)
    it = iter(loader)
    next(it)  # start-up is workload d's business
    start, nbytes = time.perf_counter(), 0
    for batch in it:
        array = batch.numpy()
        np.copyto(out[: len(array)], array)
        nbytes += array.nbytes
    return nbytes / (time.perf_counter() - start) / 1e9


def _rate(loader, amount) -> float:
    """``amount(batch)`` summed over the batches after the first (start-up is
    workload d's business), per second."""
    it = iter(loader)
    next(it)
    start, total = time.perf_counter(), 0
    for batch in it:
        total += amount(batch)
    return total / (time.perf_counter() - start)


def run_small(kind: str, batches: int) -> float:
    """Batches per second of 32 int samples."""
    loader = _loader(kind, workloads.Ints(32 * (batches + 1)), batch_size=32, num_workers=2)
    return _rate(loader, lambda batch: 1)


def run_small_stats(kind: str, batches: int) -> dict:
    """(b) through conveyor, stats on or off: batches per second, and CPU
    microseconds per batch of the main process and its workers together
    (the workers are stopped and reaped at the end of the pass, so their
    CPU time is counted)."""
    import resource

    import conveyor.torch as ct

    def cpu_s() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    dataset = workloads.Ints(32 * (batches + 1))
    loader = ct.DataLoader(dataset, batch_size=32, num_workers=2, collect_stats=kind == "stats_on")
    cpu_before = cpu_s()
    it = iter(loader)
    next(it)
    start, count = time.perf_counter(), 0
    for _ in it:
        count += 1
    rate = count / (time.perf_counter() - start)
    del it
    gc.collect()
    return {"rate": rate, "cpu_us": (cpu_s() - cpu_before) / (count + 1) * 1e6}


#: Workload j's conveyor set-ups: DataLoader arguments, and the reads in flight they allow.
WAITING = {
    "conveyor": ({"num_workers": 2, "reads_in_flight": 8}, 16),
    "conveyor_processes": ({"num_workers": 2}, 2),
    "conveyor_threads": ({"num_workers": 8, "worker_method": "thread", "reads_in_flight": 4}, 32),
}


def run_waiting(kind: str, batches: int) -> float:
    """Samples per second of samples that each wait 20 ms: torch with 2
    worker processes; conveyor as WAITING says (2 processes reading 8
    samples at a time; 2 processes reading one after another; 8 worker
    threads reading 4 at a time)."""
    if kind == "torch":
        loader = _loader("torch", workloads.Waits(32 * (batches + 1)), batch_size=32, num_workers=2)
    else:
        import conveyor.torch as ct

        settings, in_flight = WAITING[kind]
        batches = batches * max(1, in_flight // 8)  # (as long a run as the others)
        loader = ct.DataLoader(workloads.Waits(32 * (batches + 1)), batch_size=32, **settings)
    return _rate(loader, lambda batch: len(batch))


def run_huge(kind: str, batches: int = 4) -> float:
    """Seconds from iter() to the end of ``batches`` batches of one 2 GB
    sample each, 2 workers; the consumer reads one byte in every page (as
    a copy to a device would touch them all)."""
    loader = _loader(kind, workloads.Huge(batches), batch_size=1, num_workers=2)
    start = time.perf_counter()
    total = 0
    for batch in loader:
        total += int(batch.numpy()[0, ::4096].sum())
    elapsed = time.perf_counter() - start
    del loader
    gc.collect()
    return elapsed


def run_images(kind: str, root: str) -> float:
    """Samples per second of the JPEG pipeline."""
    from conveyor.cli.demo import ImageFolder

    loader = _loader(kind, ImageFolder(root, crop=224), batch_size=32, num_workers=2, shuffle=True)
    return _rate(loader, lambda batch: len(batch[1]))


def single_process_images(root: str, samples: int = 600) -> float:
    """Samples per second of (c)'s pipeline in one process, no loader: the
    dataset's own rate, collated in batches of 32 (twice this is the
    two-core ceiling of (c))."""
    import torch
    import torch.utils.data as tud

    from conveyor.cli.demo import ImageFolder

    dataset = ImageFolder(root, crop=224)
    order = np.random.default_rng(0).permutation(len(dataset))[:samples]
    tud.default_collate([dataset[int(i)] for i in order[:32]])  # warm
    start = time.perf_counter()
    for k in range(0, len(order), 32):
        tud.default_collate([dataset[int(i)] for i in order[k : k + 32]])
    del torch
    return len(order) / (time.perf_counter() - start)


def run_torch_augmented(kind: str, batches: int) -> float:
    """Samples per second of the torch-op augmentation pipeline."""
    loader = _loader(kind, workloads.TorchAugmented(32 * (batches + 1)), batch_size=32, num_workers=2)
    return _rate(loader, lambda batch: len(batch[1]))


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op threads in the main process set to ``n`` for a while
    (its forked workers start with the same setting unless they change it)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_FIRST_BATCH_SCRIPT = textwrap.dedent(
    """
    import sys, time
    start = time.perf_counter()
    import torch  # a training script has torch loaded
    sys.path.insert(0, {bench!r})
    import workloads
    if {kind!r} == "torch":
        import torch.utils.data as data
    else:
        import conveyor.torch as data
    if __name__ == "__main__":
        t0 = time.perf_counter()
        loader = data.DataLoader(workloads.Ints(64), batch_size=32, num_workers=2, multiprocessing_context="spawn")
        next(iter(loader))
        print(time.perf_counter() - t0)
    """
)


def run_first_batch(kind: str, tmp: Path) -> float:
    """Seconds from DataLoader() to the first batch under spawn, in a fresh script."""
    script = tmp / f"first_batch_{kind}.py"
    script.write_text(_FIRST_BATCH_SCRIPT.format(bench=str(HERE), kind=kind))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {bench!r})
    from run import run_big
    if __name__ == "__main__":
        run_big({kind!r}, {batches})
    """
)


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _memory_kb(pid: int, field: str, path: str) -> int:
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_memory(kind: str, tmp: Path, batches: int, measure: str = "rss") -> float:
    """Peak MB of memory, main process plus workers, during (a), sampled
    every 10 ms: resident (``rss``: shared pages count in every process that
    maps them) or proportional (``pss``: shared pages split between them)."""
    field, path = ("VmRSS:", "status") if measure == "rss" else ("Pss:", "smaps_rollup")
    script = tmp / f"memory_{kind}.py"
    script.write_text(_MEMORY_SCRIPT.format(bench=str(HERE), kind=kind, batches=batches))
    proc = subprocess.Popen([sys.executable, str(script)])
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_memory_kb(p, field, path) for p in _tree(proc.pid)))
        time.sleep(0.01)
    if proc.returncode != 0:
        raise RuntimeError(f"memory workload for {kind} failed with exit code {proc.returncode}")
    return peak / 1024


def stats_overhead(rounds: int) -> dict:
    """Workload h: the rate (paired ratio) and the CPU per batch, stats on against off."""
    cpu: dict = {"stats_on": [], "stats_off": []}

    def rate(kind: str) -> float:
        run = run_small_stats(kind, 10000)
        cpu[kind].append(run["cpu_us"])
        return run["rate"]

    measured = _alternate(rate, rounds, ("stats_on", "stats_off"))
    paired = statistics.median(on / off for on, off in zip(cpu["stats_on"], cpu["stats_off"]))
    return {
        "h_stats_overhead_small_batches_per_s": {**measured, "overhead": round(1 - measured["paired_ratio"], 4)},
        "h_stats_overhead_cpu_us_per_batch": {
            **{kind: round(statistics.median(values), 2) for kind, values in cpu.items()},
            "ratio": round(paired, 4),
            "overhead": round(paired - 1, 4),
            "samples": {kind: [round(v, 2) for v in values] for kind, values in cpu.items()},
        },
    }


# ------------------------------------------------------------ machine limits


def machine_limits() -> dict:
    """What the hardware allows, for reading the workloads against."""
    from conveyor._engine.loading.rows import SlotAllocator
    from conveyor._engine.transport.slots import SlotWriter, create_slot_fds
    from conveyor.collate import collate_into

    big = np.ones((64, 3, 224, 224), np.uint8)
    dst = np.empty_like(big)

    def best(fn, n=10):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    samples = [np.full((3, 224, 224), 7, np.uint8) for _ in range(64)]
    writer = SlotWriter(create_slot_fds(1)[0])

    warm_out = np.empty((64, 3, 224, 224), np.uint8)

    def stack_warm_buffer():
        for i, sample in enumerate(samples):
            warm_out[i] = sample

    def stack_into_slot():  # what a worker does per batch: map the slot, stack, let go
        writer.begin()
        collate_into(samples, SlotAllocator(writer))
        writer.end()

    import conveyor

    small = conveyor.DataLoader(workloads.Ints(32 * 2000), batch_size=32)
    t = time.perf_counter()
    n = sum(1 for _ in small)
    in_process_small = n / (time.perf_counter() - t)
    return {
        "memcpy_GBps": big.nbytes / best(lambda: np.copyto(dst, big)) / 1e9,
        "stack_into_warm_buffer_GBps": big.nbytes / best(stack_warm_buffer) / 1e9,
        "stack_into_slot_GBps": big.nbytes / best(stack_into_slot) / 1e9,
        "in_process_small_batches_per_s": in_process_small,
    }


# -------------------------------------------------------------------- driver


def _alternate(fn, rounds: int, kinds: tuple = ("conveyor", "torch")) -> dict:
    """``fn(kind)`` for each kind in turn, ``rounds`` times; medians, and
    the ratio of the first kind's median to the second's."""
    results: dict = {kind: [] for kind in kinds}
    for _ in range(rounds):
        for kind in kinds:
            results[kind].append(fn(kind))
    medians = {kind: statistics.median(values) for kind, values in results.items()}
    first, second = kinds
    paired = statistics.median(a / b for a, b in zip(results[first], results[second]))
    return {
        **{kind: round(median, 4) for kind, median in medians.items()},
        "ratio": round(medians[first] / medians[second], 3),
        # Each round's ratio, then their median: drift in the machine's load hits both kinds of a round alike.
        "paired_ratio": round(paired, 3),
        "samples": {k: [round(v, 4) for v in vs] for k, vs in results.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=5, help="A B rounds per workload (default 5)")
    parser.add_argument("--only", default="a,b,c,d,e,f,g,h,i,j,k,l,m,n,o", help="comma-separated workloads to run")
    args = parser.parse_args()
    only = set(args.only.split(","))
    import torch

    default_threads = torch.get_num_threads()  # what a training script runs with (g)
    torch.set_num_threads(1)
    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "platform": platform.platform(),
        },
        "workloads": {},
    }
    report["limits"] = machine_limits()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        work = report["workloads"]
        if "a" in only:
            work["a_big_batches_GBps"] = _alternate(lambda k: run_big(k, 300), args.rounds)
        if "b" in only:
            work["b_small_batches_per_s"] = _alternate(lambda k: run_small(k, 3000), args.rounds)
        if "c" in only:
            from conveyor.cli.demo import default_cache_dir, make_synthetic_images

            root = make_synthetic_images(default_cache_dir() / "synthetic-jpeg-v1")
            for path in Path(root).rglob("*.jpg"):  # both loaders then find the files in the page cache
                path.read_bytes()
            work["c_image_samples_per_s"] = _alternate(lambda k: run_images(k, str(root)), args.rounds)
            # The ceiling on two cores: twice one process's rate, measured now (median of 3).
            single = statistics.median(single_process_images(str(root)) for _ in range(3))
            work["c_image_samples_per_s"]["ceiling"] = round(2 * single, 1)
            work["c_image_samples_per_s"]["fraction_of_ceiling"] = round(
                work["c_image_samples_per_s"]["conveyor"] / (2 * single), 3
            )
        if "d" in only:
            work["d_first_batch_spawn_s"] = _alternate(lambda k: run_first_batch(k, tmp), args.rounds)
        if "e" in only:
            rounds = max(2, args.rounds // 2)
            work["e_peak_memory_MB"] = _alternate(lambda k: run_memory(k, tmp, 60, "rss"), rounds)
            work["e_peak_memory_pss_MB"] = _alternate(lambda k: run_memory(k, tmp, 60, "pss"), rounds)
        if "h" in only:
            work.update(stats_overhead(2 * args.rounds))
        if "j" in only:
            # Each with its limit: the reads in flight, each taking 20 ms.
            for kind, name in (
                ("conveyor", "j_waiting_samples_per_s"),
                ("conveyor_processes", "j_waiting_processes_only_samples_per_s"),
                ("conveyor_threads", "j_waiting_thread_workers_samples_per_s"),
            ):
                result = _alternate(lambda k: run_waiting(k, 6), args.rounds, (kind, "torch"))
                work[name] = {**result, "limit": WAITING[kind][1] / 0.02}
        if "l" in only:
            # One unmeasured run of each first: on a virtual machine, the first to touch gigabytes of
            # fresh memory waits for the host to back them (10-16 s instead of 7-8 s, whichever loader).
            run_huge("torch"), run_huge("conveyor")
            work["l_huge_sample_s"] = _alternate(lambda k: run_huge(k), max(3, args.rounds // 2))
        if "g" in only:
            with _torch_threads(default_threads):
                work["g_torch_aug_samples_per_s"] = _alternate(lambda k: run_torch_augmented(k, 40), args.rounds)
    if "f" in only:
        import resume

        report["resume"] = resume.run(resume.parse_args(["--repeats", str(args.rounds)]))
    if "k" in only:
        import list_memory

        report["list_memory"] = list_memory.run(list_memory.parse_args([]))
    if "o" in only:
        import kept_leaves

        report["kept_leaves"] = kept_leaves.run(kept_leaves.parse_args(["--rounds", str(max(2, args.rounds // 2))]))
    if "m" in only:
        import shards

        report["shards"] = shards.run(shards.parse_args(["--rounds", str(max(2, args.rounds // 2))]))
    if "n" in only:
        import store

        report["store"] = store.run(store.parse_args(["--objects", "600", "--rounds", str(max(2, args.rounds // 2))]))
    if "i" in only:
        import distributed

        report["distributed"] = distributed.run(distributed.parse_args(["--rounds", str(args.rounds)]))
    limits = report["limits"]
    if "a_big_batches_GBps" in report["workloads"]:
        report["workloads"]["a_big_batches_GBps"]["fraction_of_memcpy"] = round(
            report["workloads"]["a_big_batches_GBps"]["conveyor"] / limits["memcpy_GBps"], 3
        )
    if "b_small_batches_per_s" in report["workloads"]:
        report["workloads"]["b_small_batches_per_s"]["fraction_of_in_process"] = round(
            report["workloads"]["b_small_batches_per_s"]["conveyor"] / limits["in_process_small_batches_per_s"], 3
        )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"machine: {report['machine']}")
        print("limits: " + ", ".join(f"{k}={v:.3g}" for k, v in limits.items()))
        for name, r in report["workloads"].items():
            first, second = [k for k in r if k not in ("ratio", "samples")][:2]
            print(f"{name:28s} {first} {r[first]:>10.4g}  {second} {r[second]:>10.4g}  ratio {r['ratio']:.2f}")
        if "resume" in report:
            print("f_resume: " + json.dumps(report["resume"]))
        for name, result in report.get("list_memory", {}).get("results", {}).items():
            print(f"k_list_memory {name}: +{result['growth_MB']} MB")
        if "store" in report:
            print("n_store: " + json.dumps(report["store"]["samples_per_s"]))
        for name, result in report.get("kept_leaves", {}).get("kept", {}).items():
            print(
                f"o_kept_{name}: conveyor +{result['conveyor_MB']} MB  torch +{result['torch_MB']} MB  ratio "
                f"{result['ratio']}"
            )
        if "shards" in report:
            print("m_shards: " + json.dumps(report["shards"]["samples_per_s"]))
        for rank in report.get("distributed", {}).get("ranks", []):
            print(
                f"i_distributed rank {rank['rank']}: conveyor {rank['conveyor']:,.0f}  torch {rank['torch']:,.0f}  "
                f"ratio {rank['ratio']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
