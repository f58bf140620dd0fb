"""Any number of shards: a data set of many more shards than a process may
open files (``ulimit -n 256``) reads every sample with 0, 2 and 4 workers
and with threads, and a process's open files and maps stay bounded (the
table of shards/files.py, OPEN_FILES) however many shards it reads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conveyor.shards.records import open_shard_writer, write_sample

pytestmark = pytest.mark.timeout(600)

#: Shards of one sample each (3,000: >> the open-file limit, built in about a second).
SHARDS = 3000


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    out = tmp_path_factory.mktemp("many")
    for k in range(SHARDS):
        with open_shard_writer(str(out / f"s{k:06d}.tar")) as tar:
            write_sample(tar, f"k{k:06d}", [("cls", str(k).encode())])
    return out


READ = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    import conveyor
    from conveyor.shards import ShardDataset
    kind = {"0": dict(num_workers=0), "2": dict(num_workers=2, multiprocessing_context="fork"),
            "4": dict(num_workers=4, multiprocessing_context="fork"),
            "threads": dict(num_workers=2, worker_method="thread")}[sys.argv[2]]
    dataset = ShardDataset(sys.argv[1], transform=lambda s: s["cls"])
    got = [c for batch in conveyor.DataLoader(dataset, batch_size=50, collate_fn=list, **kind) for c in batch]
    assert got == list(range(len(dataset))), "samples wrong"
    print("read", len(got))
""")


@pytest.mark.parametrize("kind", ["0", "2", "4", "threads"])
def test_every_sample_of_many_shards_reads_under_a_low_open_file_limit(many, kind):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", READ, str(many), kind], capture_output=True, text=True, timeout=500,
                          env=env)  # fmt: skip
    assert done.returncode == 0 and f"read {SHARDS}" in done.stdout, done.stderr[-3000:]


def test_open_files_and_maps_stay_bounded_while_reading_many_shards(many):
    from conveyor.shards import ShardDataset
    from conveyor.shards.files import OPEN_FILES

    def counts() -> tuple:
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        with open("/proc/self/maps") as f:
            maps = sum(str(many) in line for line in f)
        return sum(str(many) in path for path in fds), maps

    dataset = ShardDataset(many)
    most = (0, 0)
    for i in range(len(dataset)):
        assert dataset[i]["cls"] == i
        if i % 100 == 0:
            most = tuple(map(max, most, counts()))
    assert most[0] <= OPEN_FILES and most[1] == 0, most
