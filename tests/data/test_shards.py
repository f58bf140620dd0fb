"""Packed shards: ``conveyor pack`` writes tar shards in the WebDataset
layout (bounded, deterministic, resumable, with a manifest and an index),
``--verify`` checks them, ``ShardDataset`` reads them with random access
(and shards the webdataset package wrote), ``stream()`` reads them shard by
shard."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import conveyor
from conveyor.cli import main as cli
from conveyor.shards import ShardDataset

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]


@pytest.fixture
def folder(tmp_path):
    """root/<class>/<file>: 3 classes, 23 files of varied sizes and kinds."""
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for n in range(23):
        label = ["cat", "dog", "eel"][n % 3]
        (root / label).mkdir(parents=True, exist_ok=True)
        ext = ".jpg" if n % 4 else ".png"
        (root / label / f"img{n:03d}{ext}").write_bytes(rng.bytes(int(rng.integers(100, 3000))))
    return root


def expected_samples(root):
    classes = sorted(p.name for p in root.iterdir())
    return [
        (path.read_bytes(), label, path.suffix[1:])
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
    ]


def digests(out):
    return {
        p: hashlib.sha256(open(os.path.join(out, p), "rb").read()).hexdigest()
        for p in sorted(os.listdir(out))
        if p.endswith(".tar")
    }


def test_a_folder_packs_into_bounded_deterministic_shards_that_read_back(folder, tmp_path, capsys):
    one, three = tmp_path / "one", tmp_path / "three"
    assert cli(["pack", str(folder), str(one), "--max-samples", "5", "--workers", "1"]) == 0
    assert cli(["pack", str(folder), str(three), "--max-samples", "5", "--workers", "3"]) == 0
    assert "packed 23 samples into 5 shards" in capsys.readouterr().out
    assert digests(one) == digests(three) and len(digests(one)) == 5  # the same bytes, whatever the workers
    manifest = json.loads((one / "manifest.json").read_text())
    assert manifest["samples"] == 23 and manifest["classes"] == ["cat", "dog", "eel"]
    assert [s["samples"] for s in manifest["shards"]] == [5, 5, 5, 5, 3]
    assert all(s["sha256"] == digests(one)[s["name"]] for s in manifest["shards"])
    dataset = ShardDataset(one)
    assert len(dataset) == 23
    for i, (data, label, ext) in enumerate(expected_samples(folder)):
        sample = dataset[i]
        assert sample[ext] == data and sample["cls"] == label and sample["__key__"] == f"{i:09d}"


def test_max_bytes_bounds_every_shard(folder, tmp_path):
    out = tmp_path / "out"
    assert cli(["pack", str(folder), str(out), "--max-bytes", "20K"]) == 0
    sizes = [os.path.getsize(out / name) for name in digests(out)]
    assert len(sizes) > 1 and max(sizes) <= 20 * 1024
    assert len(ShardDataset(out)) == 23


def test_verify_finds_a_changed_shard(folder, tmp_path, capsys):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "8"])
    assert cli(["pack", "--verify", str(out)]) == 0
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli(["pack", "--verify", str(out)]) == 1
    assert "FAIL shard-000001.tar: its SHA-256 differs" in capsys.readouterr().out


def test_an_interrupted_packing_picks_up_where_it_stopped(folder, tmp_path):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "5"])
    before = digests(out)
    kept = os.stat(out / "shard-000000.tar").st_mtime_ns
    # As if stopped while writing shard 3: no record, a partial file, no manifest.
    (out / "shard-000003.tar.json").unlink()
    (out / "shard-000003.tar").unlink()
    (out / "shard-000003.tar.tmp").write_bytes(b"partial")
    (out / "manifest.json").unlink()
    assert cli(["pack", str(folder), str(out), "--max-samples", "5"]) == 0
    assert digests(out) == before
    assert os.stat(out / "shard-000000.tar").st_mtime_ns == kept  # not written again
    assert cli(["pack", "--verify", str(out)]) == 0
    # Other settings into the same folder: refused.
    assert cli(["pack", str(folder), str(out), "--max-samples", "7"]) == 2


class Records:
    """A map-style dataset of dicts: an array, a label, a caption."""

    def __len__(self):
        return 9

    def __getitem__(self, i):
        return {"npy": np.arange(i * 3, dtype=np.float32).reshape(i, 3), "cls": i % 4, "txt": f"sample {i}"}


def make_records():
    return Records()


def test_a_dataset_from_a_factory_packs_and_decodes(tmp_path):
    out = tmp_path / "out"
    assert cli(["pack", f"{__file__}:make_records", str(out), "--max-samples", "4"]) == 0
    dataset = ShardDataset(out)
    for i in range(9):
        sample = dataset[i]
        np.testing.assert_array_equal(sample["npy"], Records()[i]["npy"])
        assert sample["cls"] == i % 4 and sample["txt"] == f"sample {i}"


@pytest.mark.parametrize(
    "kind",
    [
        dict(num_workers=0),
        dict(num_workers=2),
        dict(num_workers=2, worker_method="thread"),
        dict(num_workers=1, multiprocessing_context="spawn"),
    ],
    ids=["0", "2", "threads", "spawn"],
)
def test_shuffled_batches_are_the_same_for_any_workers(folder, tmp_path, kind):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "6"])
    dataset = (
        ShardDataset(out, transform=lambda s: (s["__key__"], s["cls"]))
        if not kind.get("multiprocessing_context")
        else ShardDataset(out)
    )  # (a lambda does not pickle for spawn)
    keys = lambda batch: [s[0] if isinstance(s, tuple) else s["__key__"] for s in batch]  # noqa: E731
    base = [
        keys(b) for b in conveyor.DataLoader(ShardDataset(out), batch_size=4, shuffle=True, seed=1, collate_fn=list)
    ]
    got = [keys(b) for b in conveyor.DataLoader(dataset, batch_size=4, shuffle=True, seed=1, collate_fn=list, **kind)]
    assert got == base and sorted(k for b in got for k in b) == [f"{i:09d}" for i in range(23)]


def test_shards_the_webdataset_package_writes_read_and_it_reads_ours(tmp_path, folder):
    wds = pytest.importorskip("webdataset")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    with wds.TarWriter(str(theirs / "part-0.tar")) as sink:
        for i in range(7):
            sink.write({"__key__": f"s{i:03d}", "txt": f"caption {i}", "cls": i})
    dataset = ShardDataset(str(theirs / "part-0.tar"))  # (no index beside it: its headers are read)
    assert [(s["__key__"], s["txt"], s["cls"]) for s in (dataset[i] for i in range(7))] == [
        (f"s{i:03d}", f"caption {i}", i) for i in range(7)
    ]
    ours = tmp_path / "ours"
    cli(["pack", str(folder), str(ours), "--max-samples", "10"])
    read = list(wds.WebDataset(sorted(str(p) for p in ours.glob("*.tar")), shardshuffle=False))
    expected = expected_samples(folder)
    assert len(read) == 23
    for i, sample in enumerate(read):
        data, label, ext = expected[i]
        assert sample["__key__"] == f"{i:09d}" and sample[ext] == data and int(sample["cls"]) == label


def test_the_stream_reads_every_sample_once_shard_by_shard(folder, tmp_path):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "4"])
    stream = ShardDataset(out, transform=lambda s: s["__key__"]).stream(shuffle_shards=True, seed=3)
    loader = conveyor.DataLoader(stream, batch_size=None, num_workers=2, worker_method="thread")
    first = list(loader)
    assert sorted(first) == [f"{i:09d}" for i in range(23)]
    stream.set_epoch(1)
    second = list(loader)
    assert sorted(second) == sorted(first) and second != first  # shards in another order
    for shard_start in range(0, 23, 4):  # within a shard, samples keep their order
        keys = [f"{i:09d}" for i in range(shard_start, min(shard_start + 4, 23))]
        positions = [first.index(k) for k in keys]
        assert positions == sorted(positions)


def test_the_command_runs_as_a_module_and_refuses_bad_input(tmp_path, folder):
    run = lambda *a: subprocess.run([sys.executable, "-m", "conveyor.cli", "pack", *a], capture_output=True, text=True)  # noqa: E731
    assert run(str(folder), str(tmp_path / "o")).returncode == 2  # no bound
    bad = run(str(tmp_path / "nothing"), str(tmp_path / "o"), "--max-samples", "3")
    assert bad.returncode == 2 and "neither a folder nor MODULE:FACTORY" in bad.stderr
    assert run(str(folder), str(tmp_path / "o"), "--max-samples", "3").returncode == 0
    with tarfile.open(tmp_path / "o" / "shard-000000.tar") as tar:
        assert [m.name for m in tar.getmembers()][:2] == ["000000000.png", "000000000.cls"]
        assert {m.mtime for m in tar.getmembers()} == {0}


def test_a_shuffled_epoch_over_shards_resumes_exactly(folder, tmp_path):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "6"])

    def loader():
        return conveyor.DataLoader(
            ShardDataset(out, transform=lambda s: s["__key__"]),
            batch_size=3,
            shuffle=True,
            seed=4,
            num_workers=2,
            collate_fn=list,
        )

    full, head, state, rest = interrupted_and_resumed(loader, 3)
    assert head + rest == full


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_resumes_where_it_stood(folder, tmp_path, num_workers):
    out = tmp_path / "out"
    cli(["pack", str(folder), str(out), "--max-samples", "4"])

    def loader():
        stream = ShardDataset(out, transform=lambda s: s["__key__"]).stream(shuffle_shards=True, seed=5)
        return conveyor.DataLoader(stream, batch_size=3, num_workers=num_workers, collate_fn=list)

    full, head, state, rest = interrupted_and_resumed(loader, 3)
    assert any(copy["iterator_state"] for copy in state["copies"]["states"])  # (where each reader stood, saved)
    assert head + rest == full


def interrupted_and_resumed(loader, batches):
    """(a whole pass, the first ``batches`` of another, the state saved then,
    the rest from a new loader that loaded that state); ``loader()`` makes one."""
    full = list(loader())
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(batches)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    return full, head, state, list(resumed)


def test_writing_processes_started_by_spawn_write_the_same_bytes(folder, tmp_path):
    from conveyor.cli.pack import pack

    forked, spawned = tmp_path / "fork", tmp_path / "spawn"
    pack(str(folder), str(forked), 5, 16 * 1024, 2, start_method="fork")
    pack(str(folder), str(spawned), 5, 16 * 1024, 2, start_method="spawn")
    assert digests(forked) == digests(spawned) and len(digests(forked)) > 4
