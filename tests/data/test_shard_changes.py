"""A file changed under a reader is an error, never a dead interpreter: a
shard truncated or rewritten in place while a loader reads it gives a
ShardError naming the shard (num_workers=0, thread and fork workers), no
sample of mixed or new bytes is delivered, and the next epoch reads every
sample once the shard is whole again. Each scenario runs in its own process
(tests/data/shard_changes_job.py), so a reader that dies of SIGBUS fails the test
instead of ending the run."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from conveyor.shards import ShardDataset, ShardError
from conveyor.shards.records import open_shard_writer, write_sample

pytestmark = pytest.mark.timeout(180)

JOB = os.path.join(os.path.dirname(__file__), "shard_changes_job.py")


@pytest.mark.parametrize("kind", ["0", "threads", "fork"])
@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_shard_changed_while_a_loader_reads_it_is_a_shard_error(tmp_path, how, kind):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, JOB, str(tmp_path / "shards"), how, kind], capture_output=True, text=True, timeout=150, env=env
    )
    assert done.returncode == 0, f"the reader died ({done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == "ShardError" and "shard-000000.tar" in result["message"], result
    assert result["whole"], "a sample of changed bytes was delivered"
    assert result["next_epoch"], result


def write(path, fill: int, samples: int = 8) -> None:
    with open_shard_writer(str(path)) as tar:
        for n in range(samples):
            write_sample(tar, f"k{n:03d}", [("bin", bytes([fill + n]) * 3000)])


def test_a_shard_rewritten_between_reads_is_refused_then_read_anew(tmp_path):
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    assert dataset[0]["bin"] == bytes([0]) * 3000
    with open(tmp_path / "a.tar", "r+b") as f:  # (same size, other bytes, in place)
        stat = os.fstat(f.fileno())
        write(tmp_path / "b.tar.new", 50)
        f.write((tmp_path / "b.tar.new").read_bytes())
    os.utime(tmp_path / "a.tar", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    (tmp_path / "b.tar.new").unlink()
    with pytest.raises(ShardError, match=r"a\.tar: changed while it was read"):
        dataset[1]
    assert dataset[1]["bin"] == bytes([51]) * 3000  # (opened anew: the file as it is now, whole)


def test_a_shard_cut_short_before_it_is_opened_names_its_size(tmp_path):
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    os.truncate(tmp_path / "a.tar", 4096)
    with pytest.raises(ShardError, match=r"a\.tar: 4096 bytes now"):
        dataset[0]


@pytest.mark.parametrize("linked", [False, True])
def test_a_file_renamed_over_a_held_shard_is_read_instead(tmp_path, monkeypatch, linked):
    import conveyor.shards.files as files

    if linked:  # (the file opened keeps a link elsewhere: only a look at the path tells, here at every read)
        monkeypatch.setattr(files, "PATH_CHECK_S", 0.0)
    else:  # (its link count tells at once)
        monkeypatch.setattr(files, "PATH_CHECK_S", 3600.0)
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    assert dataset[0]["bin"] == bytes([0]) * 3000
    if linked:
        os.link(tmp_path / "a.tar", tmp_path / "kept.tar.old")
    write(tmp_path / "a.tar.new", 50)
    os.replace(tmp_path / "a.tar.new", tmp_path / "a.tar")
    assert dataset[1]["bin"] == bytes([51]) * 3000


def rewrite_in_place(path, fill: int, since: os.stat_result, half: bool = False) -> None:
    """Rewrite ``path`` in place with other bytes of its size as one write() does: its mtime set (a
    tick after ``since``, whatever the clock's grain) before its bytes; ``half``: paused halfway."""
    write(str(path) + ".new", fill)
    new = open(str(path) + ".new", "rb").read()
    os.remove(str(path) + ".new")
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, new[: len(new) // 2] if half else new, 0)
    finally:
        os.close(fd)
    os.utime(path, ns=(since.st_atime_ns, since.st_mtime_ns + 1_000_000))


STRADDLING = 4  # (8 samples of 3584 bytes in a tar of 30720: sample 4's bytes lie across the middle)


def test_a_shard_first_opened_in_the_middle_of_a_rewrite_in_place_is_refused_then_read_anew(tmp_path):
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    assert dataset[0]["bin"] == bytes([0]) * 3000
    dataset.close_shard(0)  # (its file let go: the next read opens it, as a worker that starts late does)
    before = os.stat(tmp_path / "a.tar")
    rewrite_in_place(tmp_path / "a.tar", 50, before, half=True)
    index = dataset.indexes[0]
    first, last = index.offsets[index.starts[STRADDLING]], index.offsets[index.starts[STRADDLING + 1] - 1]
    assert first < index.tar_bytes // 2 < last + 3000  # (what it would read: half old bytes, half new)
    with pytest.raises(ShardError, match=r"a\.tar: rewritten in place since the dataset was opened"):
        dataset[STRADDLING]
    rewrite_in_place(tmp_path / "a.tar", 50, before)  # (the write done: its mtime the one set at its start)
    assert dataset[STRADDLING]["bin"] == bytes([54]) * 3000  # (the refusal is this process's record now)


@pytest.mark.parametrize("travels", ["fork", "pickle"])
def test_a_worker_compares_its_first_open_with_the_record_of_the_dataset_it_got(tmp_path, travels):
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    rewrite_in_place(tmp_path / "a.tar", 50, os.stat(tmp_path / "a.tar"), half=True)
    if travels == "pickle":  # (a spawned worker's copy)
        got = pickle.loads(pickle.dumps(dataset))
        with pytest.raises(ShardError, match=r"a\.tar: rewritten in place"):
            got[STRADDLING]
        return
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # (a forked worker: the record inherited, the table its own)
        try:
            dataset[STRADDLING]
            os.write(write_end, b"read")
        except ShardError as exc:
            os.write(write_end, b"refused" if "rewritten in place" in str(exc) else b"other")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        assert f.read() == b"refused"


def test_a_file_renamed_over_the_recorded_one_is_opened_and_becomes_the_record(tmp_path):
    write(tmp_path / "a.tar", 0)
    dataset = ShardDataset(tmp_path)
    write(tmp_path / "a.tar.new", 50)
    os.replace(tmp_path / "a.tar.new", tmp_path / "a.tar")  # (another file, before any read: accepted)
    assert dataset[1]["bin"] == bytes([51]) * 3000
    dataset.close_shard(0)
    rewrite_in_place(tmp_path / "a.tar", 70, os.stat(tmp_path / "a.tar"), half=True)
    with pytest.raises(ShardError, match=r"a\.tar: rewritten in place"):  # (against the new file's record)
        dataset[STRADDLING]
