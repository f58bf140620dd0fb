"""The Store's local cache: private to the user (0700 folder, 0600 files,
a folder others may write refused), never hands out a copy it did not
write itself (a planted file, a file of the wrong size, a partial copy
renamed over an entry, bytes changed in place), counts the downloads in
progress against ``cache_bytes`` and removes those of killed processes,
keeps to its size least recently used first, and streams a large object
to disk with memory bounded by the chunk."""

from __future__ import annotations

import glob
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

import conveyor
from conveyor.cli import main as cli
from conveyor.shards import ShardDataset
from conveyor.store import Store

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = bytes(range(256)) * 40 + b"tail"


def local_store(tmp_path, files=None, **kwargs) -> Store:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    for name, data in (files or {"a.bin": DATA}).items():
        (folder / name).write_bytes(data)
    kwargs.setdefault("cache_dir", str(tmp_path / "cache"))
    return Store(f"file://{folder}", **kwargs)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {TESTS!r})\n" + code],
        capture_output=True,
        text=True,
        **kwargs,
    )


def test_the_cache_folder_and_its_files_are_yours_alone_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = local_store(tmp_path, cache_dir=None)
    assert store.cache_dir == str(tmp_path / f"conveyor-store-cache-{os.getuid()}")  # (one folder per user)
    old = os.umask(0)
    try:
        assert read(store.fetch("a.bin")) == DATA
    finally:
        os.umask(old)
    assert mode(store.cache_dir) == 0o700
    files = os.listdir(store.cache_dir)
    assert len(files) == 2 and {mode(os.path.join(store.cache_dir, f)) for f in files} == {0o600}  # (entry, record)


@pytest.mark.parametrize("whose", ["another user's", "writable by others"])
def test_a_cache_folder_that_is_not_private_is_refused(tmp_path, whose):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    (folder / "planted").write_bytes(b"not the object")
    if whose == "another user's":
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        os.chown(folder, 12345, 12345)
    else:
        folder.chmod(0o777)
    with pytest.raises(PermissionError, match=r"cache folder .*cache_dir="):
        local_store(tmp_path, cache_dir=str(folder))
    store = local_store(tmp_path, cache_dir=str(tmp_path / "elsewhere"))
    store.cache_dir = str(folder)  # (a folder that became someone else's after the Store was made)
    with pytest.raises(PermissionError, match="cache folder"):
        store.fetch("a.bin")
    assert os.listdir(folder) == ["planted"]


def test_a_cache_folder_of_yours_that_others_may_read_is_made_private(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o755)
    store = local_store(tmp_path)
    assert read(store.fetch("a.bin")) == DATA
    assert mode(tmp_path / "cache") == 0o700


def _planted(entry: str) -> None:
    for record in glob.glob(os.path.join(os.path.dirname(entry), "*.record")):
        os.unlink(record)
    with open(entry, "wb") as f:
        f.write(b"planted" * 100)


def _truncated(entry: str) -> None:
    os.truncate(entry, 100)


def _partial_copy_renamed(entry: str) -> None:
    with open(entry + ".copy", "wb") as f:
        f.write(read(entry)[:1000])
    os.replace(entry + ".copy", entry)


def _same_size_copy_renamed(entry: str) -> None:
    with open(entry + ".copy", "wb") as f:
        f.write(b"x" * os.path.getsize(entry))
    os.replace(entry + ".copy", entry)


TAMPERED = {
    "planted without a record": _planted,
    "wrong size": _truncated,
    "partial copy renamed": _partial_copy_renamed,
    "same size, another file": _same_size_copy_renamed,
}


@pytest.mark.parametrize("tamper", TAMPERED.values(), ids=TAMPERED.keys())
def test_an_entry_conveyor_did_not_write_is_fetched_again(tmp_path, tamper, caplog):
    store = local_store(tmp_path)
    entry = store.fetch("a.bin")
    tamper(entry)
    with caplog.at_level(logging.WARNING, logger="conveyor"):
        again = store.fetch("a.bin")
    assert again == entry and read(again) == DATA
    if tamper is not _planted:  # (a file without a record is simply not trusted; one that disagrees is reported)
        assert "is not used" in caplog.text and entry in caplog.text
    assert sorted(os.listdir(tmp_path / "cache"))[1].endswith(".record") and len(os.listdir(tmp_path / "cache")) == 2


@pytest.mark.timeout(60)
def test_bytes_changed_in_place_are_found_by_the_hash_check_of_the_next_process(tmp_path):
    store = local_store(tmp_path)
    entry = store.fetch("a.bin")
    with open(entry, "r+b") as f:  # (same file, same size, other bytes: only a read of the whole file finds it)
        f.write(b"XXXX")
    code = (
        "from conveyor.store import Store\n"
        f"store = Store('file://{tmp_path / 'data'}', cache_dir={str(tmp_path / 'cache')!r}, verify_cached=VERIFY)\n"
        "print(open(store.fetch('a.bin'), 'rb').read(4))\n"
    )
    trusting = run_python(code.replace("VERIFY", "'size'"), check=True)
    assert trusting.stdout.strip() == "b'XXXX'"  # (verify_cached="size" trusts size, inode and record: the trade-off)
    checking = run_python(code.replace("VERIFY", "'hash'"), check=True)
    assert checking.stdout.strip() == repr(DATA[:4]) and "SHA-256" in checking.stderr
    assert read(entry) == DATA


def _cached_bytes(folder) -> int:
    return sum(os.lstat(os.path.join(folder, f)).st_size for f in os.listdir(folder))


@pytest.mark.timeout(60)
def test_downloads_in_progress_count_and_those_of_killed_processes_are_removed(tmp_path):
    small = {f"s{i}.bin": bytes([i]) * 100_000 for i in range(6)}
    store = local_store(tmp_path, {**small, "big.bin": os.urandom(4 << 20)}, cache_bytes=1 << 20)
    slow = (
        "from store_fakes import FlakyFS\n"
        "from conveyor.store import Store\n"
        "FlakyFS.read_pause_s = 0.2\n"
        f"store = Store('flaky://{tmp_path / 'data'}', cache_dir={str(tmp_path / 'cache')!r}, chunk_bytes=256 << 10)\n"
        "store.fetch('big.bin')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {TESTS!r})\n" + slow])
    try:
        deadline = time.monotonic() + 30
        while not [p for p in glob.glob(str(tmp_path / "cache" / "*.part")) if os.path.getsize(p) >= 512 << 10]:
            assert time.monotonic() < deadline and child.poll() is None, "the slow download never got going"
            time.sleep(0.05)
        child.send_signal(signal.SIGSTOP)  # (alive, and its .part stays the size it is)
        part_bytes = os.path.getsize(glob.glob(str(tmp_path / "cache" / "*.part"))[0])
        for name in small:
            assert read(store.fetch(name)) == small[name]
        assert glob.glob(str(tmp_path / "cache" / "*.part"))  # (its writer is alive: kept, and counted)
        # (counted: without it the six entries would fit; with it, some made way)
        assert part_bytes + 6 * 100_000 > 1 << 20 >= _cached_bytes(tmp_path / "cache")
    finally:
        child.kill()
        child.wait()
    assert glob.glob(str(tmp_path / "cache" / "*.part"))  # (killed: left behind, as a killed process leaves it)
    assert read(store.fetch("s0.bin")) == small["s0.bin"]
    assert not glob.glob(str(tmp_path / "cache" / "*.part"))  # (the next pass removed it)


def test_the_least_recently_used_entries_go_first(tmp_path):
    files = {name: name.encode() * 500 for name in ("a.bin", "b.bin", "c.bin", "d.bin")}
    probe = local_store(tmp_path, files, cache_dir=str(tmp_path / "probe"))
    probe.fetch("a.bin")
    one = _cached_bytes(tmp_path / "probe")  # (an entry and its record)
    store = local_store(tmp_path, files, cache_bytes=3 * one + 10)
    entries = {name: store.fetch(name) for name in ("a.bin", "b.bin", "c.bin")}
    for when, name in enumerate(("b.bin", "c.bin", "a.bin")):
        os.utime(entries[name], (1000 + when, 1000 + when))
    store.fetch("d.bin")
    kept = {name for name, entry in entries.items() if os.path.exists(entry)}
    assert kept == {"a.bin", "c.bin"}
    assert _cached_bytes(tmp_path / "cache") <= 3 * one + 10


def test_a_use_marks_the_entry_used_and_leaves_its_modification_time_to_the_readers(tmp_path):
    """A process reading a cached shard checks its modification time
    (shards/files.py); another process's fetch of the same shard must not
    change it, or the reader would take the copy for one changed under it."""
    store = local_store(tmp_path)
    entry = store.fetch("a.bin")
    os.utime(entry, (1000, 1000))
    again = local_store(tmp_path)  # (another process's fetch: the copy found in the cache)
    assert again.fetch("a.bin") == entry
    assert os.stat(entry).st_mtime == 1000 and os.stat(entry).st_atime > 1000


def test_a_released_copy_makes_room_first_and_stays_usable_until_then(tmp_path):
    files = {name: name.encode() * 500 for name in ("a.bin", "b.bin", "c.bin", "d.bin")}
    probe = local_store(tmp_path, files, cache_dir=str(tmp_path / "probe"))
    probe.fetch("a.bin")
    one = _cached_bytes(tmp_path / "probe")  # (an entry and its record)
    store = local_store(tmp_path, files, cache_bytes=3 * one + 10)
    entries = {name: store.fetch(name) for name in ("a.bin", "b.bin", "c.bin")}  # (a: the least recently used)
    store.release("c.bin")  # (done with the newest)
    assert store.fetch("c.bin") == entries["c.bin"]  # (still there, and used again: no longer released)
    store.release("b.bin")
    store.fetch("d.bin")
    assert {name for name, entry in entries.items() if os.path.exists(entry)} == {"a.bin", "c.bin"}


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


def test_a_shard_whose_copy_is_evicted_between_fetch_and_open_is_fetched_again(tmp_path, monkeypatch):
    root = tmp_path / "files"
    for i in range(12):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(bytes([i]) * 500)
    assert cli(["pack", str(root), str(tmp_path / "shards"), "--max-samples", "4"]) == 0
    store = Store(f"file://{tmp_path}", cache_dir=str(tmp_path / "cache"))
    fetch, evicted = store.fetch, []

    def fetch_then_lose_it(path: str) -> str:
        local = fetch(path)
        if not evicted:  # (another worker's download makes room just now)
            evicted.append(path)
            os.unlink(local)
        return local

    monkeypatch.setattr(store, "fetch", fetch_then_lose_it)
    stream = ShardDataset("shards", store=store, transform=lambda s: s["__key__"]).stream(prefetch=0)
    keys = list(conveyor.DataLoader(stream, batch_size=None))
    assert keys == [f"{i:09d}" for i in range(12)] and evicted
