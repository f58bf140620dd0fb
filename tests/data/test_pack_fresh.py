"""``conveyor pack`` again over a packed folder: a changed source (a file
edited, even keeping its size and mtime with --check full; added; removed)
is found, said, and re-packed into the bytes a fresh pack of it gives;
an unchanged one is "already packed ... up to date"."""

from __future__ import annotations

import os

import pytest

from conveyor.cli import main as cli
from conveyor.cli.pack import verify

pytestmark = pytest.mark.timeout(120)


def files_of(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            (root / c / f"{i}.bin").write_bytes(f"{c}{i}".encode() * 100)
    return root


def pack(src, out, *extra):
    return cli(["pack", str(src), str(out), "--max-samples", "3", "--workers", "1", *extra])


def fresh_pack_equals(src, out, tmp_path):
    again = tmp_path / "fresh"
    assert pack(src, again) == 0
    assert files_of(out) == files_of(again)
    assert verify(str(out)) == []


def test_an_unchanged_source_is_up_to_date(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack(src, out) == 0
    before = {name: os.stat(out / name).st_mtime_ns for name in os.listdir(out)}
    capsys.readouterr()
    assert pack(src, out) == 0
    assert "already packed: 10 samples in 4 shards" in capsys.readouterr().out
    assert {name: os.stat(out / name).st_mtime_ns for name in os.listdir(out)} == before


def test_an_edit_keeping_the_size_is_found_and_repacked(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack(src, out) == 0
    kept = os.stat(out / "shard-000000.tar").st_mtime_ns
    edited = src / "b" / "0.bin"
    st = os.stat(edited)
    edited.write_bytes(b"X" * st.st_size)
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    capsys.readouterr()
    assert pack(src, out) == 0
    said = capsys.readouterr().out
    assert "source changed since" in said and "1 file edited, 0 added, 0 removed; re-packing 1 of 4 shards" in said
    assert os.stat(out / "shard-000000.tar").st_mtime_ns == kept
    fresh_pack_equals(src, out, tmp_path)


def test_an_edit_keeping_size_and_mtime_is_found_by_the_full_check(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack(src, out) == 0
    edited = src / "a" / "1.bin"
    st = os.stat(edited)
    edited.write_bytes(b"Y" * st.st_size)
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    assert pack(src, out) == 0
    assert "already packed" in capsys.readouterr().out  # (the cheap check cannot see it, as documented)
    assert pack(src, out, "--check", "full") == 0
    assert "1 file edited, 0 added, 0 removed; re-packing 1 of 4 shards" in capsys.readouterr().out
    fresh_pack_equals(src, out, tmp_path)


def test_a_file_added_is_packed(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack(src, out) == 0
    (src / "a" / "10.bin").write_bytes(b"new" * 10)
    capsys.readouterr()
    assert pack(src, out) == 0
    assert "0 files edited, 1 added, 0 removed" in capsys.readouterr().out
    fresh_pack_equals(src, out, tmp_path)


def test_a_file_removed_leaves_no_stale_shard(src, tmp_path, capsys):
    out = tmp_path / "out"
    assert pack(src, out) == 0
    (src / "b" / "4.bin").unlink()
    capsys.readouterr()
    assert pack(src, out) == 0
    assert "0 files edited, 0 added, 1 removed; re-packing" in capsys.readouterr().out
    assert not (out / "shard-000003.tar").exists()
    fresh_pack_equals(src, out, tmp_path)


class Numbers:
    def __len__(self):
        return int(os.environ.get("CONVEYOR_TEST_FRESH_N", "7"))

    def __getitem__(self, i):
        return {"txt": f"{os.environ.get('CONVEYOR_TEST_FRESH_WORD', 'old')} {i}", "cls": i}


def make_numbers():
    return Numbers()


def test_a_changed_dataset_is_found_by_its_bytes(tmp_path, capsys, monkeypatch):
    out, spec = tmp_path / "out", f"{__file__}:make_numbers"
    assert pack(spec, out) == 0
    monkeypatch.setenv("CONVEYOR_TEST_FRESH_WORD", "new")
    capsys.readouterr()
    assert pack(spec, out) == 0
    assert "7 samples changed, 0 added, 0 removed; re-packing 3 of 3 shards" in capsys.readouterr().out
    fresh_pack_equals(spec, out, tmp_path)
