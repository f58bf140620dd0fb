"""Memory held by the leaves a user keeps of each batch, and what giving each
leaf its own lifetime costs.

    python bench/kept_leaves.py [--rounds 3] [--before SRC]

kept: the eval idiom ``targets = [y for x, y in loader]`` (issue 32), for
conveyor.torch and torch.utils.data, 2 forked workers:
  label  200 batches of 64 x (3x64x64 float32 image, int label): each label
         tensor (512 bytes, a small leaf) kept.
  mask   60 batches of 64 x (3x64x64 float32 image, 48x48 uint8 mask): each
         mask tensor (144 KiB, a large leaf: a zero-copy view on its slot
         in conveyor) kept beside the 3 MB of images let go.
Each run is a fresh script; memory is the main process's PSS (anonymous and
shared memory only, not the pages of shared libraries, which move with
whatever else the machine runs) before iterating and after the loop (the
workers gone), with every kept leaf read once (a page of shared memory
counts only in the processes that touched it), the growth of a run keeping
nothing subtracted: what the kept leaves hold. Medians of ``--rounds``;
ratio conveyor/torch (lower is better).

cost: workload a of bench/run.py (64 x 3x224x224 uint8 batches, 2 workers,
the consumer copying every byte; GB/s) and the same batches with an int
label per sample (the labels copied out of the slot as they are delivered),
with this checkout's conveyor and with the one in ``--before`` (a ``src``
folder, say from ``git archive``), alternating, each run in a fresh
process: ratio after/before (about 1: within noise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

KEPT_SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys
    import torch
    loader_kind, case, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "keep"
    batches = 200 if case == "label" else 60

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 64 * batches
        def __getitem__(self, i):
            if case == "label":
                return torch.zeros(3, 64, 64), i % 10
            return torch.zeros(3, 64, 64), torch.ones(48, 48, dtype=torch.uint8)

    def memory_kb():
        # Anonymous and shared memory only: the pages of shared libraries
        # move with what else the machine runs.
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith(("Pss_Anon:", "Pss_Shmem:")))

    if loader_kind == "torch":
        import torch.utils.data as data
    else:
        import conveyor.torch as data
    loader = data.DataLoader(Images(), batch_size=64, num_workers=2, multiprocessing_context="fork")
    gc.collect()
    before = memory_kb()
    kept = []
    for x, y in loader:
        if keep:
            kept.append(y)
    del loader, x, y
    gc.collect()
    total = sum(int(t.sum()) for t in kept)  # every kept page read, so its process maps it
    print(json.dumps({"growth_kB": memory_kb() - before, "kept": len(kept), "sum": total}))
    """
)

COST_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    sys.path.insert(0, {bench!r})
    import conveyor
    from run import run_big

    class Labelled:
        def __init__(self, n):
            self.n = n
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            return np.full((3, 224, 224), i % 251, dtype=np.uint8), i

    def run_labelled(batches):
        import conveyor.torch as ct
        loader = ct.DataLoader(Labelled(64 * (batches + 1)), batch_size=64, num_workers=2)
        out = np.empty((64, 3, 224, 224), np.uint8)
        it = iter(loader)
        next(it)
        start, nbytes = time.perf_counter(), 0
        for images, labels in it:
            array = images.numpy()
            np.copyto(out[: len(array)], array)
            nbytes += array.nbytes + labels.numpy().nbytes
        return nbytes / (time.perf_counter() - start) / 1e9

    if __name__ == "__main__":
        rate = run_big("conveyor", 300) if sys.argv[1] == "a" else run_labelled(300)
        print(conveyor.__file__)
        print(rate)
    """
)


def kept(rounds: int) -> dict:
    """Median growth of the main process's PSS, keeping each batch's leaf and keeping none, per case and loader."""
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "kept.py"
        script.write_text(KEPT_SCRIPT)
        for case in ("label", "mask"):
            runs: dict = {f"{kind}_{keep}": [] for kind in ("conveyor", "torch") for keep in ("keep", "none")}
            for _ in range(rounds):
                for name in runs:
                    kind, keep = name.split("_")
                    out = subprocess.run(
                        [sys.executable, str(script), kind, case, keep],
                        capture_output=True,
                        text=True,
                        timeout=600,
                        check=True,
                        env={**os.environ, "PYTHONPATH": str(SRC)},
                    )
                    runs[name].append(json.loads(out.stdout.strip().splitlines()[-1])["growth_kB"])
            medians = {name: statistics.median(values) for name, values in runs.items()}
            held = {kind: (medians[f"{kind}_keep"] - medians[f"{kind}_none"]) / 1024 for kind in ("conveyor", "torch")}
            results[case] = {
                "conveyor_MB": round(held["conveyor"], 2),
                "torch_MB": round(held["torch"], 2),
                "ratio": round(held["conveyor"] / held["torch"], 3) if held["torch"] > 0 else None,
                "samples_kB": runs,
            }
    return results


def cost(rounds: int, before: Path) -> dict:
    """Workload a (and a with labels) through this checkout's conveyor and the one in ``before``, alternating."""
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "cost.py"
        script.write_text(COST_SCRIPT.format(bench=str(HERE)))
        for workload, name in (("a", "a_big_batches_GBps"), ("labels", "a_big_batches_with_labels_GBps")):
            rates: dict = {"after": [], "before": []}
            files = {}
            for _ in range(rounds):
                for side, src in (("after", SRC), ("before", before)):
                    out = subprocess.run(
                        [sys.executable, str(script), workload],
                        capture_output=True,
                        text=True,
                        timeout=600,
                        check=True,
                        env={**os.environ, "PYTHONPATH": str(src)},
                    )
                    where, rate = out.stdout.strip().splitlines()[-2:]
                    files[side] = where
                    rates[side].append(float(rate))
            medians = {side: statistics.median(values) for side, values in rates.items()}
            paired = statistics.median(a / b for a, b in zip(rates["after"], rates["before"]))
            results[name] = {
                **{side: round(m, 4) for side, m in medians.items()},
                "ratio": round(medians["after"] / medians["before"], 3),
                "paired_ratio": round(paired, 3),
                "samples": {side: [round(v, 4) for v in values] for side, values in rates.items()},
                "conveyor": files,
            }
    return results


def run(args: argparse.Namespace) -> dict:
    import numpy
    import torch

    report: dict = {
        "benchmark": "kept_leaves",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "platform": platform.platform(),
        },
        "kept": kept(args.rounds),
        "unit_kept": "MB of the main process's PSS held by the kept leaves (growth keeping them minus growth keeping "
        "none)",
    }
    if args.before:
        report["cost"] = cost(args.rounds + 2, Path(args.before))
    return report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default=None, help="a src folder of conveyor to compare the cost against")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse_args()), indent=2))
