"""Processes and threads that fetch the same object share one download
(store/_turns.py): the others wait while it makes progress and then use
its entry; a holder that stalls is waited for no longer, one that dies
lets go at once, and no lock file is left behind."""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conveyor.store import Store, _turns
from conveyor.store._cache import Cache, _key
from store_fakes import FlakyFS

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.urandom(1 << 20)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.bin").write_bytes(DATA)
    return folder


def flaky_store(tmp_path, data, **kwargs) -> Store:
    return Store(f"flaky://{data}", cache_dir=str(tmp_path / "cache"), chunk_bytes=64 << 10, **kwargs)


def downloads() -> int:
    return sum(1 for call in FlakyFS.calls if call[0] == "open")


def locks(tmp_path) -> list:
    return glob.glob(str(tmp_path / "cache" / "*.lock"))


def _child(tmp_path, data, body: str) -> subprocess.Popen:
    code = (
        f"import sys, os, time; sys.path.insert(0, {TESTS!r})\n"
        "from store_fakes import FlakyFS\n"
        "from conveyor.store import Store\n"
        f"store = Store('flaky://{data}', cache_dir={str(tmp_path / 'cache')!r}, chunk_bytes=64 << 10)\n" + body
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_processes_fetching_the_same_object_download_it_once(tmp_path, data):
    go = tmp_path / "go"
    body = (
        "FlakyFS.reset(read_pause_s=0.02)\n"  # (16 chunks: about a third of a second a download)
        f"open({str(tmp_path)!r} + f'/ready{{os.getpid()}}', 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
        "path = store.fetch('a.bin')\n"
        "import hashlib; print(sum(c[0] == 'open' for c in FlakyFS.calls), path,"
        " hashlib.sha256(open(path, 'rb').read()).hexdigest())\n"
    )
    children = [_child(tmp_path, data, body) for _ in range(3)]
    deadline = time.monotonic() + 60
    while len(glob.glob(str(tmp_path / "ready*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    said = [child.communicate(timeout=60)[0].split() for child in children]
    assert [child.returncode for child in children] == [0, 0, 0]
    import hashlib

    assert {(path, digest) for _, path, digest in said} == {(said[0][1], hashlib.sha256(DATA).hexdigest())}
    assert sum(int(opens) for opens, _, _ in said) == 1, said
    assert locks(tmp_path) == []


def test_threads_fetching_the_same_object_download_it_once(tmp_path, data):
    FlakyFS.reset(read_pause_s=0.02)
    store = flaky_store(tmp_path, data)
    barrier = threading.Barrier(4)
    paths = []

    def fetch():
        barrier.wait()
        paths.append(store.fetch("a.bin"))

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(paths) == 4 and len(set(paths)) == 1
    assert open(paths[0], "rb").read() == DATA
    assert downloads() == 1
    assert locks(tmp_path) == []


def _hold(tmp_path, data, part_name: str):
    """Take a.bin's turn in another thread of this process; returns a function that lets go."""
    cache = Cache(str(tmp_path / "cache"), 10 << 30, "hash")
    key = _key(f"flaky://{data}/a.bin")
    held, release = threading.Event(), threading.Event()

    def holder():
        with _turns.turn(cache.folder, key, part_name):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)

    def let_go():
        release.set()
        thread.join(10)

    return let_go


def test_a_holder_that_makes_no_progress_is_waited_for_no_longer(tmp_path, data, monkeypatch, caplog):
    monkeypatch.setattr(_turns, "STALL_S", 0.3)
    FlakyFS.reset()
    let_go = _hold(tmp_path, data, "nothing-grows.part")
    try:
        with caplog.at_level(logging.WARNING, logger="conveyor"):
            assert open(flaky_store(tmp_path, data).fetch("a.bin"), "rb").read() == DATA
    finally:
        let_go()
    assert downloads() == 1
    assert any("made no progress" in r.getMessage() for r in caplog.records)
    assert locks(tmp_path) == []


def test_a_holder_that_makes_progress_is_waited_for_and_its_entry_used(tmp_path, data, monkeypatch):
    # (its download, 16 chunks 0.2 s apart, takes longer than STALL_S: its progress keeps us waiting;
    # a busy machine would have to hold it back 2 s between two chunks to make us go ahead)
    monkeypatch.setattr(_turns, "STALL_S", 2.0)
    child = _child(tmp_path, data, "FlakyFS.reset(read_pause_s=0.2)\nstore.fetch('a.bin')\nprint('done')\n")
    try:
        deadline = time.monotonic() + 60
        while not glob.glob(str(tmp_path / "cache" / "*.part")) and time.monotonic() < deadline:
            time.sleep(0.01)  # (its download has begun, and it holds the turn)
        FlakyFS.reset()
        path = flaky_store(tmp_path, data).fetch("a.bin")
        assert open(path, "rb").read() == DATA
        assert downloads() == 0  # (its entry, not a download of our own)
    finally:
        child.communicate(timeout=60)
    assert locks(tmp_path) == []


def test_a_holder_that_dies_lets_go_at_once(tmp_path, data, monkeypatch):
    monkeypatch.setattr(_turns, "STALL_S", 600.0)  # (were its turn kept, this test would time out)
    key = _key(f"flaky://{data}/a.bin")
    child = _child(
        tmp_path,
        data,
        "from conveyor.store import _turns\n"
        "store._cache()\n"
        f"with _turns.turn(store.cache_dir, {key!r}, 'its.part'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n",
    )
    try:
        assert child.stdout.readline().strip() == "held"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        assert len(locks(tmp_path)) == 1  # (left by the killed holder)
        FlakyFS.reset()
        assert open(flaky_store(tmp_path, data).fetch("a.bin"), "rb").read() == DATA
        assert downloads() == 1
    finally:
        child.kill()
        child.wait()
    assert locks(tmp_path) == []


def test_eviction_removes_a_lock_file_left_behind_but_never_a_held_one(tmp_path):
    folder = tmp_path / "cache"
    cache = Cache(str(folder), 10 << 30, "hash")
    left = folder / f"{'0' * 16}.lock"
    left.touch(mode=0o600)
    held_path = folder / f"{'1' * 16}.lock"
    fd = os.open(held_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        cache.evict()
        assert not left.exists() and held_path.exists()
    finally:
        os.close(fd)
    cache.evict()
    assert not held_path.exists()
