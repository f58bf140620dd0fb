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
