"""Downloads stream to disk: ``Store.fetch`` writes an object into the
cache a chunk at a time, so the peak memory of the fetching process grows
by a few chunks, not by the object, and the copy is still checked against
the object's record (its size, and the MD5 its ETag gives) before it is
handed out. bench/store_fetch_memory.py measures a 512 MB object; this
test fetches 32 MB in 512 KB chunks (through moto, each ranged GET costs
in proportion to the whole object), so its bound is 64 MB scaled likewise,
to 4 MB."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from object_store import BUCKET, GARBLED  # noqa: E402

pytestmark = [pytest.mark.timeout(180)]

SIZE_BYTES = 32 << 20
CHUNK_BYTES = 512 << 10
#: 64 MB of growth allowed for a 512 MB object, scaled to this one (holding it whole would grow by 64 MB).
BOUND_BYTES = (64 << 20) * SIZE_BYTES // (512 << 20)

#: The fetching process: its peak resident memory (VmHWM) just before and after the fetch. (Not
#: ``ru_maxrss``: a child's counts the parent's pages at the fork, the uploaded object among them.)
CHILD = (
    """
import json, sys
from conveyor.store import Store

def peak():
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmHWM:"))

options, cache_dir, chunk_bytes = json.loads(sys.argv[1])
store = Store("s3://%s", storage_options=options, cache_dir=cache_dir, chunk_bytes=chunk_bytes, backoff_s=0.01)
store.fs.retries = 1  # (s3fs's own retry loop off: every retry here is conveyor's)
store.fetch("small.bin")  # (the imports, a connection, fsspec's IO thread: before the mark)
before = peak()
local = store.fetch("big.bin")
print(json.dumps({"grown": peak() - before, "local": local}))
"""
    % BUCKET
)


def test_a_fetch_streams_to_disk_and_is_checked_against_the_md5_before_it_is_handed_out(server, tmp_path):
    import boto3

    data = np.random.default_rng(7).integers(0, 256, SIZE_BYTES, dtype=np.uint8).tobytes()
    direct = boto3.client(
        "s3",
        endpoint_url=f"http://{server.host}:{server.port}",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    direct.put_object(Bucket=BUCKET, Key="big.bin", Body=data)  # (one part: its ETag is the MD5 of the bytes)
    direct.put_object(Bucket=BUCKET, Key="small.bin", Body=b"small")
    want = hashlib.sha256(data).hexdigest()
    del data
    gets: list = []
    # The third chunk's answer has its middle byte changed: only the MD5 of the whole can tell.
    server.garble = lambda method, path, n: method == "GET" and "big.bin" in path and len(gets.append(n) or gets) == 3
    args = [server.options(), str(tmp_path / "cache"), CHUNK_BYTES]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    got = hashlib.sha256()
    with open(result["local"], "rb") as f:
        while block := f.read(8 << 20):
            got.update(block)
    assert got.hexdigest() == want  # (not the copy with the changed byte: fetched again)
    assert [s for _, p, s in server.requests if "big.bin" in p].count(GARBLED) == 1
    print(
        f"peak memory grew by {result['grown'] / 2**20:.1f} MB fetching {SIZE_BYTES >> 20} MB in "
        f"{CHUNK_BYTES >> 10} KB chunks (twice: the first copy failed its MD5)"
    )
    assert result["grown"] <= BOUND_BYTES
    direct.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "big.bin"}, {"Key": "small.bin"}]})
