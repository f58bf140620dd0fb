"""``conveyor pack`` on a hostile or failing machine: links out of SRC are
not followed unless asked (and what was skipped is said); a full disk or a
refused permission is one line naming the file and the cause, leaves no
shard that --verify accepts, and the same command again resumes; the help
reads as text for people."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile

import pytest

from conveyor.cli import main as cli
from conveyor.cli.pack import verify
from conveyor.cli.pack_verify import shard_problems
from conveyor.shards import ShardDataset
from conveyor.shards.manifest import shard_record

pytestmark = pytest.mark.timeout(120)

SECRET = b"-----BEGIN PRIVATE KEY----- not for training"


def all_shard_bytes(out) -> bytes:
    return b"".join((out / name).read_bytes() for name in sorted(os.listdir(out)) if name.endswith(".tar"))


@pytest.fixture
def linked(tmp_path):
    """SRC with a link to a file outside, a class folder that links outside, and a link to a file inside."""
    elsewhere = tmp_path / "home"
    (elsewhere / "keys").mkdir(parents=True)
    (elsewhere / "id_rsa").write_bytes(SECRET)
    (elsewhere / "keys" / "key.pem").write_bytes(SECRET + b" 2")
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "dog").mkdir()
    (src / "cat" / "a.jpg").write_bytes(b"cat a")
    (src / "dog" / "b.jpg").write_bytes(b"dog b")
    (src / "cat" / "id_rsa.jpg").symlink_to(elsewhere / "id_rsa")
    (src / "keys").symlink_to(elsewhere / "keys")
    (src / "dog" / "same-as-a.jpg").symlink_to(src / "cat" / "a.jpg")
    return src


def test_links_out_of_src_are_skipped_and_named(linked, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["pack", str(linked), str(out), "--max-samples", "10", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "skipped 2 link(s) leading out of SRC" in err and "--follow-links" in err
    assert "cat/id_rsa.jpg -> " in err and "keys -> " in err
    assert SECRET not in all_shard_bytes(out)
    samples = [ShardDataset(out)[i] for i in range(3)]
    # The link that stays inside SRC is packed as the file it leads to; the classes are the two real folders.
    assert [(s["jpg"], s["cls"]) for s in samples] == [(b"cat a", 0), (b"dog b", 1), (b"cat a", 1)]


def test_follow_links_packs_what_they_lead_to(linked, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["pack", str(linked), str(out), "--max-samples", "10", "--workers", "1", "--follow-links"]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert SECRET in all_shard_bytes(out)
    assert len(ShardDataset(out)) == 5


# ---------------------------------------------------------- failing writes
#: "ERRNO:K": the writing of shards K on fails with that error (set by the tests; spawned writers inherit it).
FAIL_ENV = "CONVEYOR_TEST_PACK_FAILS"


class Numbers:
    """12 samples of 3000 bytes each."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"bin": bytes([i]) * 3000, "cls": i}


def make_numbers():
    """The dataset, with a failure injected into this process's shard writing when FAIL_ENV says so."""
    if os.environ.get(FAIL_ENV):
        inject_failure(*os.environ[FAIL_ENV].split(":"))
    return Numbers()


class FullDisk(io.FileIO):
    """A file on a disk that fills up after its first 2048 bytes."""

    def write(self, data):
        if self.tell() + len(data) > 2048:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def inject_failure(name: str, first: str) -> None:
    import conveyor.cli.packing as packing

    real = packing.open_shard_writer

    def failing(path):
        if int(re.search(r"shard-(\d+)", path).group(1)) < int(first):
            return real(path)
        if name == "EACCES":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        if name == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        return tarfile.open(fileobj=FullDisk(path, "w"), mode="w", format=tarfile.USTAR_FORMAT)

    packing.open_shard_writer = failing


def run_pack(*args, start_method="fork", fail=None):
    """``conveyor pack ARGS`` in a new process whose writers start by ``start_method``; ``fail``: FAIL_ENV's value."""
    code = (
        "import sys, conveyor.cli.packing as p; m = sys.argv.pop(1); p.multiprocessing.get_all_start_methods = "
        "lambda: [m];"
        "from conveyor.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {key: value for key, value in os.environ.items() if key != FAIL_ENV}
    if fail is not None:
        env[FAIL_ENV] = fail
    return subprocess.run(
        [sys.executable, "-c", code, start_method, "pack", *map(str, args)], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("failure, cause", [("ENOSPC", "No space left on device"), ("EACCES", "Permission denied")])
def test_a_full_disk_or_refused_write_is_one_line_and_a_rerun_resumes(tmp_path, start_method, failure, cause):
    out, spec = tmp_path / "out", f"{__file__}:make_numbers"
    # Writing shard 2 fails in the writing process (forked: the failure was set up before the fork; spawned:
    # each writer sets it up as it opens the source).
    failed = run_pack(spec, out, "--max-samples", "3", "--workers", "1", start_method=start_method, fail=f"{failure}:2")
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("conveyor pack: error: cannot write ")
    assert "shard-000002.tar" in lines[0] and cause in lines[0]
    # Nothing vouches for the unfinished shard: no record, no manifest (--verify refuses the folder); each
    # record there is of a whole shard (shard 3 may have been handed to the writer before shard 2 failed).
    records = sorted(p for p in os.listdir(out) if p.startswith("shard-") and p.endswith(".json"))
    assert records[:2] == ["shard-000000.tar.json", "shard-000001.tar.json"] and "shard-000002.tar.json" not in records
    for name in records:
        assert shard_problems(str(out), shard_record(json.loads((out / name).read_text()), name, "record")) == []
    assert "manifest.json" not in os.listdir(out) and not any(p.endswith(".tmp") for p in os.listdir(out))
    assert verify(str(out)) != []
    kept = os.stat(out / "shard-000000.tar").st_mtime_ns
    again = run_pack(spec, out, "--max-samples", "3", "--workers", "2", start_method=start_method)
    assert again.returncode == 0, again.stderr
    assert verify(str(out)) == []
    assert os.stat(out / "shard-000000.tar").st_mtime_ns == kept  # (kept, not written again)
    dataset = ShardDataset(out)
    assert [dataset[i]["cls"] for i in range(12)] == list(range(12))


def test_a_writing_process_that_dies_is_one_line_not_a_hang(tmp_path):
    out, spec = tmp_path / "out", f"{__file__}:make_numbers"
    failed = run_pack(spec, out, "--max-samples", "3", "--workers", "2", fail="KILL:2")
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and "conveyor pack: error: a process writing shards died" in lines[0]
    assert "manifest.json" not in os.listdir(out) and "shard-000002.tar.json" not in os.listdir(out)
    assert run_pack(spec, out, "--max-samples", "3", "--workers", "2").returncode == 0
    assert verify(str(out)) == []


def test_an_out_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "x.bin").write_bytes(b"x")
    result = run_pack(tmp_path / "src", tmp_path / "a-file" / "out", "--max-samples", "3")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "conveyor pack: error: cannot create the folder" in lines[0]
    assert "a-file" in lines[0] and "Not a directory" in lines[0]


def test_the_help_reads_as_paragraphs_and_examples(capsys):
    with pytest.raises(SystemExit):
        cli(["pack", "--help"])
    text = capsys.readouterr().out
    assert "\n\nexamples:\n  conveyor pack data/train shards/train --max-bytes 1G\n" in text
    assert "\n  conveyor pack --verify shards/train\n" in text
    assert "--follow-links" in text and "``" not in text and "──" not in text
    paragraphs = text.split("\n\n")
    assert all(max(len(line) for line in p.splitlines()) <= 90 for p in paragraphs if p.strip())
