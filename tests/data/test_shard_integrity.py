"""Reading shards never hands out bytes that were not checked against their
record: a damaged or stale tar, index (.idx) or manifest.json is refused with
an error naming the file, the sample and what disagrees; the index is tied to
its tar (size, hash); each member's tar header is checked at every read, from
a local file read and from a store's ranged read; manifest paths stay in their folder.
The same damages make ``conveyor pack --verify`` fail, naming each."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest

from conveyor.cli import main as cli
from conveyor.shards import ShardDataset

pytestmark = pytest.mark.timeout(60)

FILES = 20


def content(n: int) -> bytes:
    return bytes([n]) * (300 + 97 * n)


@pytest.fixture
def packed(tmp_path):
    """20 files of distinct bytes packed into 2 shards of 10 samples; sample i is file i."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "c").mkdir()
    for n in range(FILES):
        (root / "c" / f"f{n:03d}.bin").write_bytes(content(n))
    out = tmp_path / "shards"
    assert cli(["pack", str(root), str(out), "--max-samples", "10", "--workers", "1"]) == 0
    return out


def read_all(source, **kwargs) -> list:
    dataset = ShardDataset(source, **kwargs)
    return [dataset[i] for i in range(len(dataset))]


def edit_index(path, **changes) -> None:
    """Rewrite an index file with some of its arrays changed (a function of the old array, or a new one)."""
    with np.load(path) as saved:
        arrays = {key: saved[key] for key in saved.files}
    for key, change in changes.items():
        arrays[key] = change(arrays[key].copy()) if callable(change) else change
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def truncate_keeping_mtime(path, size) -> None:
    stat = os.stat(path)
    with open(path, "r+b") as f:
        f.truncate(size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # (as a copy that kept the times would)


def swap(a, b):
    def change(values):
        values[[a, b]] = values[[b, a]]
        return values

    return change


def setitem(position, value):
    def change(values):
        values[position] = value
        return values

    return change


TAR = "shard-000000.tar"
IDX = "shard-000000.tar.idx"

#: Ways a shard or its index goes wrong: each edits the packed folder.
DAMAGES = {
    "truncated tar, stale index": lambda out: truncate_keeping_mtime(out / TAR, os.path.getsize(out / TAR) // 2),
    # (members 0 and 2 are the data of samples 0 and 1; 1 and 3 their labels)
    "swapped offsets": lambda out: edit_index(out / IDX, offsets=swap(0, 2)),
    "offset past the end": lambda out: edit_index(out / IDX, offsets=setitem(-2, os.path.getsize(out / TAR) + 4096)),
    "negative offset": lambda out: edit_index(out / IDX, offsets=setitem(0, -512)),
    "huge size": lambda out: edit_index(out / IDX, sizes=setitem(0, 2**62)),
    "index of another shard": lambda out: shutil.copy(out / "shard-000001.tar.idx", out / IDX),
}


def without_manifest(folder):
    """A folder of tars and indexes with no manifest and none of a pack's own files (as another tool
    writes it): a data set of its tars. (With plan.json or .tar.json records left it is an unfinished
    pack, refused: tests/data/test_unfinished_pack.py.)"""
    for name in ["manifest.json", "plan.json", *(p.name for p in folder.glob("*.tar.json"))]:
        (folder / name).unlink(missing_ok=True)


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
def test_a_damaged_shard_or_index_is_an_error_never_wrong_bytes(packed, damage, manifest):
    DAMAGES[damage](packed)
    if not manifest:
        without_manifest(packed)
    with pytest.raises(ValueError) as caught:
        read_all(packed)
    assert TAR in str(caught.value)
    from conveyor.shards import ShardError

    assert isinstance(caught.value, ShardError)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_verify_fails_on_each_damage(packed, damage, capsys):
    assert cli(["pack", "--verify", str(packed)]) == 0
    DAMAGES[damage](packed)
    capsys.readouterr()
    assert cli(["pack", "--verify", str(packed)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and TAR in out and "OK" not in out


def test_verify_names_every_problem_not_only_the_first(packed, capsys):
    edit_index(packed / IDX, offsets=swap(0, 2))
    truncate_keeping_mtime(packed / "shard-000001.tar", 4096)
    assert cli(["pack", "--verify", str(packed)]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert any(IDX in line for line in failed)
    assert any("shard-000001.tar" in line for line in failed)


def skip_sample(path, s) -> None:
    """Edit an index consistently (members in order, inside the tar, its record of the tar kept) but
    wrongly: sample ``s``'s members left out, so sample ``s`` on points at the members of the next one."""
    with np.load(path) as saved:
        arrays = {key: saved[key].copy() for key in saved.files}
    first, stop = arrays["starts"][s], arrays["starts"][s + 1]
    for key in ("offsets", "sizes", "ext_ids"):
        arrays[key] = np.delete(arrays[key], np.arange(first, stop))
    arrays["keys"] = arrays["keys"][:-1]
    arrays["starts"] = np.concatenate([arrays["starts"][: s + 1], arrays["starts"][s + 2 :] - (stop - first)])
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_an_index_that_points_at_the_wrong_member_is_caught_when_the_sample_is_read(packed):
    # Only the tar header before each member can tell (no manifest to count the samples against).
    skip_sample(packed / IDX, 5)
    without_manifest(packed)
    dataset = ShardDataset(packed)
    assert [dataset[i]["bin"] for i in range(5)] == [content(n) for n in range(5)]  # (before the edit: right)
    with pytest.raises(ValueError) as caught:
        dataset[5]
    message = str(caught.value)
    assert TAR in message and "sample 5" in message and "000000006.bin" in message


def test_a_damaged_tar_header_is_caught_when_its_sample_is_read(packed):
    tar = packed / TAR
    with np.load(packed / IDX) as saved:
        header = int(saved["offsets"][6]) - 512  # (sample 3's data member)
    data = bytearray(tar.read_bytes())
    data[header + 130] ^= 0x01  # (a bit of its size field)
    tar.write_bytes(bytes(data))
    dataset = ShardDataset(packed)
    assert dataset[2]["bin"] == content(2)
    with pytest.raises(ValueError, match=r"shard-000000\.tar.*sample 3"):
        dataset[3]


def test_an_index_from_an_earlier_format_is_refused_with_the_fix(packed):
    with np.load(packed / IDX) as saved:
        old = {key: saved[key] for key in ("keys", "starts", "offsets", "sizes", "ext_ids", "exts")}
    with open(packed / IDX, "wb") as f:
        np.savez(f, **old)
    with pytest.raises(ValueError, match=rf"{IDX}.*delete it"):
        ShardDataset(packed)


MALFORMED_INDEXES = {
    "not a zip": lambda path: path.write_bytes(b"not an index at all"),
    "a pickled object": lambda path: edit_index(path, keys=np.array([object()] * 10, dtype=object)),
    "float offsets": lambda path: edit_index(path, offsets=lambda v: v.astype(np.float64)),
    "shapes disagree": lambda path: edit_index(path, sizes=lambda v: v[:-3]),
    "starts not monotonic": lambda path: edit_index(path, starts=swap(3, 4)),
    "ext_ids out of range": lambda path: edit_index(path, ext_ids=setitem(0, 7)),
    "two-dimensional keys": lambda path: edit_index(path, keys=lambda v: v.reshape(2, 5)),
    "a key missing": lambda path: _drop_key(path, "starts"),
}


def _drop_key(path, key):
    with np.load(path) as saved:
        kept = {k: saved[k] for k in saved.files if k != key}
    with open(path, "wb") as f:
        np.savez(f, **kept)


@pytest.mark.parametrize("kind", list(MALFORMED_INDEXES))
def test_a_malformed_index_is_one_clear_error_naming_it(packed, kind):
    MALFORMED_INDEXES[kind](packed / IDX)
    with pytest.raises(ValueError, match=rf"{IDX}"):
        read_all(packed)


# ---------------------------------------------------------------- manifests
@pytest.mark.parametrize(
    "name", ["../other/shard-000000.tar", "/ABS/shard-000000.tar", "a/../../other/shard-000000.tar"]
)
def test_a_manifest_cannot_name_a_shard_outside_its_folder(packed, tmp_path, name, capsys):
    other = tmp_path / "other"
    shutil.copytree(packed, other)
    manifest = json.loads((packed / "manifest.json").read_text())
    manifest["shards"][0]["name"] = name.replace("/ABS", str(tmp_path / "other"))
    (packed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"manifest\.json.*shards\[0\]\.name"):
        ShardDataset(packed)
    capsys.readouterr()
    assert cli(["pack", "--verify", str(packed)]) == 1
    assert "shards[0].name" in capsys.readouterr().out


MALFORMED_MANIFESTS = {
    "a list": ([], "manifest.json"),
    "no shards": ({"samples": 20}, "shards"),
    "shards not a list": ({"samples": 20, "shards": "shard-000000.tar"}, "shards"),
    "a shard without bytes": ("drop:bytes", "shards[0].bytes"),
    "bytes as text": ("set:bytes:'12'", "shards[0].bytes"),
    "negative samples": ("set:samples:-1", "shards[0].samples"),
    "a name that is a number": ("set:name:5", "shards[0].name"),
    "a hash that is not one": ("set:sha256:'xyz'", "shards[0].sha256"),
}


@pytest.mark.parametrize("kind", list(MALFORMED_MANIFESTS))
def test_a_malformed_manifest_is_one_clear_error_naming_the_key(packed, kind, capsys):
    edit, key = MALFORMED_MANIFESTS[kind]
    manifest = json.loads((packed / "manifest.json").read_text())
    if isinstance(edit, str):
        action, field, *value = edit.split(":")
        if action == "drop":
            del manifest["shards"][0][field]
        else:
            manifest["shards"][0][field] = eval(value[0])
    else:
        manifest = edit
    (packed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as caught:
        ShardDataset(packed)
    assert "manifest.json" in str(caught.value) and key in str(caught.value)
    capsys.readouterr()
    assert cli(["pack", "--verify", str(packed)]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and key in failed[0]


def test_a_shard_whose_size_differs_from_its_manifest_record_is_refused_at_open(packed):
    with open(packed / "shard-000001.tar", "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(ValueError, match=r"shard-000001\.tar.*manifest"):
        ShardDataset(packed)


# ------------------------------------------------------- tars from elsewhere
@pytest.mark.parametrize("fmt", ["USTAR", "GNU", "PAX"])
def test_the_header_checks_accept_long_nested_and_non_ascii_names(tmp_path, fmt):
    names = ["short", "dir/sub/nested", "k" * 150, "d" * 120 + "/" + "e" * 60, "caf\u00e9-\u00fc"]
    if fmt == "USTAR":
        names = names[:2] + [names[3]]  # (USTAR holds a long name only split at a '/', and ASCII only)
    path = tmp_path / "theirs.tar"
    with tarfile.open(path, "w", format=getattr(tarfile, f"{fmt}_FORMAT")) as tar:
        for n, key in enumerate(names):
            for ext, data in (("txt", f"text {n}".encode()), ("bin", bytes([n]) * (n * 700))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    samples = read_all(str(path))
    assert [(s["__key__"], s["txt"], s["bin"]) for s in samples] == [
        (key, f"text {n}", bytes([n]) * (n * 700)) for n, key in enumerate(names)
    ]


def test_tars_the_webdataset_package_writes_pass_the_checks(tmp_path):
    wds = pytest.importorskip("webdataset")
    path = tmp_path / "part-0.tar"
    keys = ["a", "x" * 140, "caf\u00e9"]
    with wds.TarWriter(str(path)) as sink:
        for n, key in enumerate(keys):
            sink.write({"__key__": key, "txt": f"caption {n}", "cls": n})
    assert [(s["__key__"], s["txt"], s["cls"]) for s in read_all(str(path))] == [
        (key, f"caption {n}", n) for n, key in enumerate(keys)
    ]


# -------------------------------------------------------------- from a store
@pytest.fixture
def store_of(tmp_path):
    """A conveyor Store over a local folder (fsspec's file://), holding a copy of a packed folder."""
    pytest.importorskip("fsspec")
    from conveyor.store import Store

    made = []

    def make(packed):
        bucket = tmp_path / "bucket"
        shutil.copytree(packed, bucket / "shards")
        store = Store(f"file://{bucket}", cache_dir=str(tmp_path / "cache"), retries=0)
        made.append(store)
        return store, bucket / "shards"

    yield make
    for store in made:
        store.close()


def test_a_ranged_read_that_comes_back_short_is_an_error(packed, store_of):
    store, remote = store_of(packed)
    truncate_keeping_mtime(remote / TAR, os.path.getsize(remote / TAR) // 2)
    dataset = ShardDataset("shards", store=store)  # (the store's object sizes are not asked for at open)
    assert dataset[0]["bin"] == content(0)
    with pytest.raises(ValueError, match=r"shard-000000\.tar.*sample 9"):
        dataset[9]


def test_a_store_shard_read_through_a_wrong_index_is_an_error(packed, store_of):
    store, remote = store_of(packed)
    skip_sample(remote / IDX, 5)
    without_manifest(remote)
    dataset = ShardDataset("shards", store=store)
    assert dataset[4]["bin"] == content(4)
    with pytest.raises(ValueError, match=r"shard-000000\.tar.*sample 5"):
        dataset[5]
    dataset.open_shard(0)  # (the whole shard fetched and read locally: the same check)
    with pytest.raises(ValueError, match=r"shard-000000\.tar.*sample 5"):
        dataset[5]


def test_a_store_manifest_cannot_name_a_shard_outside_its_folder(packed, store_of):
    store, remote = store_of(packed)
    manifest = json.loads((remote / "manifest.json").read_text())
    manifest["shards"][1]["name"] = "../../elsewhere/shard-000001.tar"
    (remote / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"manifest\.json.*shards\[1\]\.name"):
        ShardDataset("shards", store=store)
