"""Any number of shards: a data set of 70,000 shards (far more than a
process may open files, ``ulimit -n 256``, and more than the kernel's
65,530 maps a process may hold) reads every sample with 0, 2 and 4 workers
and with threads, and a process's open files and maps stay bounded (the
table of shards/files.py, OPEN_FILES) however many shards it reads."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

from conveyor.shards.records import write_sample

pytestmark = pytest.mark.timeout(900)

#: Shards of one sample each.
SHARDS = 70_000


def one_sample_shard(k: int) -> bytes:
    """A shard's bytes as ``open_shard_writer`` writes them (a USTAR tar), made in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        write_sample(tar, f"k{k:06d}", [("cls", str(k).encode())])
    return buffer.getvalue()


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    out = tmp_path_factory.mktemp("many")
    for k in range(SHARDS):
        with open(out / f"s{k:06d}.tar", "wb") as f:
            f.write(one_sample_shard(k))
    yield out
    # Removed here, beside the other tests, rather than by pytest's clean-up of old runs' folders, which
    # unlinks all 70,000 in one process while nothing else runs (seconds, at a run's start or end).
    shutil.rmtree(out, ignore_errors=True)


READ = textwrap.dedent("""
    import json, os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    import conveyor
    from conveyor.shards import ShardDataset
    from conveyor.shards.files import OPEN_FILES

    def held(folder):
        fds = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds += os.readlink(f"/proc/self/fd/{fd}").startswith(folder)
            except OSError:
                pass
        with open("/proc/self/maps") as f:
            return fds, sum(folder in line for line in f)

    def read(sample):  # (in the worker: its own open files and maps, next to one sample in 500)
        return sample["cls"], held(sys.argv[1]) if sample["cls"] % 500 == 0 else (0, 0)

    kinds = {"0": dict(num_workers=0), "2": dict(num_workers=2, multiprocessing_context="fork"),
             "4": dict(num_workers=4, multiprocessing_context="fork"),
             "threads": dict(num_workers=2, worker_method="thread")}
    dataset = ShardDataset(sys.argv[1], transform=read)
    for kind in sys.argv[2:]:
        loader = conveyor.DataLoader(dataset, batch_size=500, collate_fn=list, **kinds[kind])
        got, most = [], [0, 0]
        for batch in loader:
            got += [c for c, _ in batch]
            for fds, maps in (h for _, h in batch):
                most = [max(most[0], fds), max(most[1], maps)]
        print(json.dumps({"kind": kind, "right": got == list(range(len(dataset))), "read": len(got),
                          "most_open": most[0], "most_maps": most[1], "limit": OPEN_FILES}), flush=True)
""")


def test_every_sample_of_70000_shards_reads_under_a_low_open_file_limit(many):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", READ, str(many), "0", "2", "4", "threads"],
        capture_output=True,
        text=True,
        timeout=800,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [run["kind"] for run in runs] == ["0", "2", "4", "threads"], done.stdout
    for run in runs:
        assert run["right"] and run["read"] == SHARDS, run
        assert 0 < run["most_open"] <= run["limit"] + 2 and run["most_maps"] == 0, run  # (+2: threads mid-read)
