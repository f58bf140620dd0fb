"""Read-around of shard reads (shards/readaround.py): the window a read lies
in is asked for once per open file, and asking stops once it has not paid
(misses outnumber hits by GIVE_UP), as a map's read-around does."""

from __future__ import annotations

import os

import pytest

from conveyor.shards import ShardDataset, readaround
from conveyor.shards.readaround import GIVE_UP, ReadAround
from conveyor.shards.records import open_shard_writer, write_sample


@pytest.fixture
def asked(monkeypatch):
    calls: list = []
    monkeypatch.setattr(readaround, "_ADVISE", lambda fd, at, size, how: calls.append((at, size, how)))
    return calls


def test_a_window_is_asked_for_once_and_reads_in_it_are_hits(asked):
    around, advised = ReadAround(), set()
    for start in (0, 4096, 100_000, 8192):
        around.before_read(3, advised, 1 << 20, start, start + 4096)
    assert asked == [(0, 1 << 20, os.POSIX_FADV_WILLNEED)]
    assert (around.misses, around.hits) == (1, 3)


def test_a_read_across_two_windows_asks_for_both(asked):
    ReadAround().before_read(3, set(), 1 << 20, (1 << 20) - 10, (1 << 20) + 10)
    assert [at for at, _, _ in asked] == [0, 1 << 20]


def test_read_around_stops_once_it_does_not_pay_and_starts_again_when_it_does(asked):
    around, advised, window = ReadAround(), set(), 1 << 20
    for w in range(GIVE_UP * 3):  # (every read in a new window: far larger than memory, random)
        around.before_read(3, advised, window, w * window, w * window + 10)
    assert len(asked) == GIVE_UP + 1
    for _ in range(GIVE_UP * 2):  # (reads fall in the windows read: it pays again)
        around.before_read(3, advised, window, 0, 10)
    around.before_read(3, advised, window, 10**9, 10**9 + 10)
    assert len(asked) == GIVE_UP + 2


def test_a_read_in_sequence_asks_for_the_window_after_too(asked):
    around, advised, window = ReadAround(), set(), 1 << 20
    around.before_read(3, advised, window, 0, 4096, sequential=True)
    around.before_read(3, advised, window, 4096, window, sequential=True)  # (its windows: asked for already)
    around.before_read(3, advised, window, window, window + 4096, sequential=True)
    assert [at for at, _, _ in asked] == [0, window, 2 * window]


def test_a_stream_asks_for_each_window_before_it_reads_in_it(tmp_path, asked, monkeypatch):
    monkeypatch.setattr(readaround, "_windows", {os.stat(tmp_path).st_dev: 64 << 10})
    with open_shard_writer(str(tmp_path / "a.tar")) as tar:
        for n in range(200):
            write_sample(tar, f"k{n:03d}", [("bin", bytes([n % 256]) * 3000)])
    reads: list = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, at: reads.append((at, len(asked))) or real(fd, size, at))
    monkeypatch.setattr("conveyor.shards.stream.READ_AHEAD", 16 << 10)
    assert [s["bin"][0] for s in ShardDataset(tmp_path).stream()] == [n % 256 for n in range(200)]
    window = 64 << 10
    for at, windows_asked in reads:  # (before each read: the window it lies in and the next one asked for)
        assert windows_asked >= at // window + 2 or windows_asked == len(asked), (at, windows_asked)
    data_end = 200 * (512 + 3072)  # (each sample: a header and its bytes padded to 512; the tar's end after)
    assert [at for at, _, _ in asked] == [w * window for w in range((data_end - 1) // window + 2)]


def test_no_window_asks_nothing(asked):
    ReadAround().before_read(3, set(), 0, 0, 10)
    assert asked == []


def test_a_device_window_is_its_read_ahead_within_bounds(tmp_path):
    window = readaround.window_of(os.stat(tmp_path).st_dev)
    assert 0 < window <= readaround.MAX_WINDOW


def test_shard_reads_ask_for_read_around_once_per_window(tmp_path, asked):
    with open_shard_writer(str(tmp_path / "a.tar")) as tar:
        for n in range(50):
            write_sample(tar, f"k{n:03d}", [("bin", bytes([n]) * 3000)])
    dataset = ShardDataset(tmp_path)
    assert [dataset[i]["bin"][0] for i in reversed(range(50))] == list(reversed(range(50)))
    window = readaround.window_of(os.stat(tmp_path / "a.tar").st_dev)
    assert len(asked) == -(-os.path.getsize(tmp_path / "a.tar") // window)
