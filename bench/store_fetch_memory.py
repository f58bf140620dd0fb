"""How much a ``Store.fetch`` of a large object adds to the peak memory of the fetching process.

    python bench/store_fetch_memory.py [--mb 512] [--chunk-mb 8] [--runs 2] [--src SRC ...]
        [--out bench/results-store-fetch-memory.json]

Starts moto's S3 server in this process (tests/object_store.py), uploads
``mb`` MB of random bytes in one part (so its ETag is their MD5), then for
each ``--src`` (a checkout's ``src`` folder: this one by default; give
another checkout's to compare), ``runs`` times, alternating:

  fetch    a fresh process fetches the object into an empty cache
           (``chunk_bytes`` = ``chunk-mb``), straight from moto
  lookup   another fresh process fetches it again: the cached copy,
           read whole once to check its SHA-256 against its record
           (``verify_cached="hash"``, the default)

Memory is the child's own peak resident set (``VmHWM`` of
/proc/self/status) just after the step minus just before it, after a small
fetch that loads the imports and opens a connection. Not ``ru_maxrss``: a
child's counts the pages of its parent at the fork (here moto, holding the
object), so it reads as the parent's size whatever the child does (it is
recorded beside, as ``ru_maxrss_bytes``, to show it). moto
holds the object in memory; it runs in this process, not in the child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"

_CHILD = """
import json, resource, sys, time
from conveyor.store import Store

def peak():
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmHWM:"))

options, cache_dir, chunk_bytes = json.loads(sys.argv[1])
store = Store("s3://data", storage_options=options, cache_dir=cache_dir, chunk_bytes=chunk_bytes)
store.fetch("small.bin")
before, start = peak(), time.perf_counter()
local = store.fetch("big.bin")
print(json.dumps({"grown_bytes": peak() - before, "s": time.perf_counter() - start, "before_bytes": before,
                  "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10}))
"""


def _commit(src: Path) -> str:
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def _child(src: Path, options: dict, cache_dir: str, chunk_bytes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps([options, cache_dir, chunk_bytes])],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"the fetching process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--chunk-mb", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--src", action="append", help="a checkout's src folder (repeat to compare)")
    parser.add_argument("--out", default=str(HERE / "results-store-fetch-memory.json"))
    args = parser.parse_args()
    sources = [Path(s).resolve() for s in (args.src or [HERE.parent / "src"])]

    sys.path.insert(0, str(TESTS))
    import boto3

    from object_store import BUCKET, ObjectStore

    server = ObjectStore.start()
    endpoint = f"http://{server.host}:{server.port}"  # (moto itself: the proxy is for injecting faults)
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )
    block = os.urandom(1 << 20)
    client.put_object(Bucket=BUCKET, Key="big.bin", Body=block * args.mb)
    client.put_object(Bucket=BUCKET, Key="small.bin", Body=b"small")
    etag = client.head_object(Bucket=BUCKET, Key="big.bin")["ETag"]
    options = {**server.options(), "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    runs: dict = {str(src): {"commit": _commit(src), "fetch": [], "lookup": []} for src in sources}
    try:
        for _ in range(args.runs):
            for src in sources:
                with tempfile.TemporaryDirectory() as cache_dir:
                    for step in ("fetch", "lookup"):
                        got = _child(src, options, cache_dir, args.chunk_mb << 20)
                        runs[str(src)][step].append(got)
                        print(
                            f"{runs[str(src)]['commit']} {step}: grew {got['grown_bytes'] / 2**20:.1f} MB "
                            f"in {got['s']:.1f} s",
                            flush=True,
                        )
    finally:
        server.stop()
    result = {
        "what": f"bench/store_fetch_memory.py --mb {args.mb} --chunk-mb {args.chunk_mb} --runs {args.runs}: "
        "peak RSS (VmHWM) added to a fresh process by Store.fetch of one object from moto's S3 server "
        "(fetch: into an empty cache; lookup: the cached copy, checked by SHA-256), alternating checkouts",
        "object_bytes": args.mb << 20,
        "object_etag": etag,
        "chunk_bytes": args.chunk_mb << 20,
        "checkouts": {
            info["commit"]: {
                step: {
                    "max_grown_bytes": max(r["grown_bytes"] for r in info[step]),
                    "median_s": round(statistics.median(r["s"] for r in info[step]), 2),
                    "grown_bytes": [r["grown_bytes"] for r in info[step]],
                    "ru_maxrss_bytes": [r["ru_maxrss_bytes"] for r in info[step]],
                }
                for step in ("fetch", "lookup")
            }
            for info in runs.values()
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
