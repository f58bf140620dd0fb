"""An unfinished folder is never a data set: a folder a ``conveyor pack``
left part way (finished shards with their records, plan.json, no
manifest.json) is refused by ShardDataset, its ``.stream()`` and through a
Store, with the same verdict ``conveyor pack --verify`` gives, naming what
is missing and how to finish it; a folder of tars another tool wrote (no
manifest, no pack files) still opens."""

from __future__ import annotations

import shutil

import pytest

from conveyor.cli import main as cli
from conveyor.cli.pack import verify
from conveyor.shards import ShardDataset, ShardError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def unfinished(tmp_path):
    """A pack of 30 samples into 3 shards, as a kill after its first shard leaves it."""
    root = tmp_path / "src"
    (root / "c").mkdir(parents=True)
    for n in range(30):
        (root / "c" / f"f{n:03d}.bin").write_bytes(bytes([n]) * 100)
    out = tmp_path / "shards"
    assert cli(["pack", str(root), str(out), "--max-samples", "10", "--workers", "1"]) == 0
    (out / "manifest.json").unlink()
    for k in (1, 2):
        for suffix in ("", ".idx", ".json"):
            (out / f"shard-00000{k}.tar{suffix}").unlink()
    assert (out / "plan.json").exists() and (out / "shard-000000.tar").exists()
    return out


def refused(caught) -> str:
    message = str(caught.value)
    assert isinstance(caught.value, ShardError)
    assert "manifest.json" in message and "unfinished" in message and "conveyor pack" in message, message
    return message


def test_the_reader_refuses_an_unfinished_folder_as_verify_does(unfinished):
    with pytest.raises(ValueError) as caught:
        ShardDataset(unfinished)
    message = refused(caught)
    assert str(unfinished) in message and "1 finished shard" in message
    assert verify(str(unfinished)) == [message]  # (one verdict, word for word)


def test_a_stream_of_an_unfinished_folder_is_refused(unfinished):
    with pytest.raises(ValueError) as caught:
        list(ShardDataset(unfinished).stream())
    refused(caught)


def test_left_over_temporary_files_alone_mark_an_unfinished_pack(unfinished):
    (unfinished / "plan.json").unlink()
    (unfinished / "shard-000000.tar.json").unlink()
    (unfinished / "shard-000001.tar.tmp").write_bytes(b"part")
    with pytest.raises(ValueError) as caught:
        ShardDataset(unfinished)
    assert "shard-000001.tar.tmp" in refused(caught)


def test_an_unfinished_folder_in_a_store_is_refused(unfinished, tmp_path):
    pytest.importorskip("fsspec")
    from conveyor.store import Store

    bucket = tmp_path / "bucket"
    shutil.copytree(unfinished, bucket / "shards")
    store = Store(f"file://{bucket}", cache_dir=str(tmp_path / "cache"), retries=0)
    with pytest.raises(ValueError) as caught:
        ShardDataset("shards", store=store)
    assert "shards" in refused(caught)


def test_a_folder_of_tars_the_webdataset_package_wrote_still_opens(tmp_path):
    webdataset = pytest.importorskip("webdataset")
    out = tmp_path / "wds"
    out.mkdir()
    for k in range(2):
        with webdataset.TarWriter(str(out / f"part-{k}.tar")) as sink:
            for n in range(5):
                sink.write({"__key__": f"s{k}{n}", "cls": k * 5 + n})
    dataset = ShardDataset(out)
    assert [dataset[i]["cls"] for i in range(len(dataset))] == list(range(10))
    assert [s["cls"] for s in dataset.stream()] == list(range(10))
