"""The Store's local cache: fetch streams a large object to disk with
memory bounded by the chunk."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {TESTS!r})\n" + code],
                          capture_output=True, text=True, **kwargs)  # fmt: skip


@pytest.mark.timeout(120)
def test_fetch_streams_a_large_object_with_memory_bounded_by_the_chunk(tmp_path):
    size = 256 << 20
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "big.bin", "wb") as f:
        f.truncate(size)  # (a sparse file: 256 MB that take no room)
    (tmp_path / "data" / "small.bin").write_bytes(b"small")
    code = (
        "import os\n"
        "from conveyor.store import Store\n"
        "def peak():\n"
        "    return next(int(l.split()[1]) << 10 for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        f"store = Store('file://{tmp_path / 'data'}', cache_dir={str(tmp_path / 'cache')!r}, chunk_bytes=8 << 20)\n"
        "store.fetch('small.bin')\n"
        "before = peak()\n"
        "local = store.fetch('big.bin')\n"
        "print(peak() - before, os.path.getsize(local))\n"
    )
    done = run_python(code, check=True)
    grown, fetched = map(int, done.stdout.split())
    assert fetched == size
    print(f"peak memory grew by {grown / 2**20:.1f} MB fetching a {size >> 20} MB object in 8 MB chunks")
    assert grown < 48 << 20  # (the whole object in memory, as before, grows it by over 256 MB)
