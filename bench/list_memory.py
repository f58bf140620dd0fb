"""Memory of a dataset holding a big Python list, read by 2 forked workers.

    python bench/list_memory.py [--items 5000000]

The dataset holds ``--items`` file names; an epoch reads each once (batch
4096, shuffled, 2 workers, fork). Reading a Python object writes its
reference count, so every page of the list that a worker reads is copied
into it (copy-on-access). Each run is a fresh script; the job's memory is
PSS summed over the main process and its workers (shared pages counted
once), sampled every 50 ms: the growth from before iterating to the peak.
For conveyor and torch.utils.data, with the names in a list and in a
conveyor.CompactList (one buffer; reading makes a new str, nothing shared
is written).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SCRIPT = """
import sys, time
loader_kind, container, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

class Names:
    def __init__(self, names):
        self.names = names
    def __len__(self):
        return len(self.names)
    def __getitem__(self, i):
        return len(self.names[i])

names = [f"/data/train/class_{i % 1000:04d}/image_{i:08d}.jpg" for i in range(n)]
if container == "compact":
    import conveyor
    names = conveyor.CompactList(names)
if loader_kind == "torch":
    import torch.utils.data as data
else:
    import conveyor.torch as data
loader = data.DataLoader(Names(names), batch_size=4096, num_workers=2, shuffle=True, multiprocessing_context="fork")
print("ready", flush=True)
time.sleep(0.5)
for batch in loader:
    pass
"""


def _tree(pid: int) -> list[int]:
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    pids += _tree(int(child))
    except OSError:
        pass
    return pids


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(loader_kind: str, container: str, items: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "names.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        proc = subprocess.Popen(
            [sys.executable, script, loader_kind, container, str(items)], stdout=subprocess.PIPE, text=True
        )
        proc.stdout.readline()  # "ready": built, not iterating yet
        before = peak = sum(_pss_kb(p) for p in _tree(proc.pid))
        while proc.poll() is None:
            peak = max(peak, sum(_pss_kb(p) for p in _tree(proc.pid)))
            time.sleep(0.05)
        if proc.returncode != 0:
            raise RuntimeError(f"{loader_kind}/{container} failed with exit code {proc.returncode}")
    return {
        "before_MB": round(before / 1024),
        "peak_MB": round(peak / 1024),
        "growth_MB": round((peak - before) / 1024),
    }


def run(args: argparse.Namespace) -> dict:
    results = {}
    for container in ("list", "compact"):
        for loader_kind in ("conveyor", "torch"):
            results[f"{loader_kind}_{container}"] = measure(loader_kind, container, args.items)
    return {
        "benchmark": "list_memory",
        "items": args.items,
        "unit": "MB of PSS, main process and workers",
        "results": results,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=5_000_000)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse_args()), indent=2))
