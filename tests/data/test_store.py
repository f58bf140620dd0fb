"""Data in an object store: loose files and shards read from a real
S3-compatible server (moto's, started here on 127.0.0.1) through fsspec,
with latency, failures and dropped connections injected by a proxy in
front of it: retries with backoff, errors not worth retrying raised at once
with their batch, a fetch that resumes, a local cache that keeps to its
size, shards prefetched. (tests/data/test_store_retry.py and
tests/data/test_store_cache.py check retries and the cache without a server.)"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import conveyor  # noqa: E402
from conveyor.cli import main as cli  # noqa: E402
from conveyor.shards import ShardDataset  # noqa: E402
from conveyor.store import Store, StoreFiles  # noqa: E402
from object_store import BUCKET, DROPPED  # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # Reading the store in this process (uploads, the index, thread workers) gives it what fsspec keeps
    # for the life of a process: an IO thread and pooled connections. Still checked and reported.
    pytest.mark.leaks_known("fsspec/s3fs keep an IO thread and pooled connections for the life of the process"),
]


@pytest.fixture
def s3(server, tmp_path):
    server.latency_s, server.fail, server.drop = 0.0, None, None
    server.requests.clear()
    yield server
    server.latency_s, server.fail, server.drop = 0.0, None, None


def make_store(s3, tmp_path, **kwargs) -> Store:
    return Store(
        f"s3://{BUCKET}", storage_options=s3.options(), cache_dir=str(tmp_path / "cache"), backoff_s=0.01, **kwargs
    )


def upload(store: Store, files: dict) -> None:
    for path, data in files.items():
        store.fs.pipe(store.url(path), data)


def objects(n=24, prefix="loose"):
    return {f"{prefix}/{i:04d}.bin": bytes([i % 251]) * (100 + i) for i in range(n)}


@pytest.mark.parametrize(
    "kind",
    [dict(num_workers=2, reads_in_flight=4), dict(num_workers=4, worker_method="thread")],
    ids=["processes", "threads"],
)
def test_loose_files_load_in_order_through_latency_and_failures(s3, tmp_path, kind):
    store = make_store(s3, tmp_path)
    files = objects()
    upload(store, files)
    s3.latency_s = 0.02
    s3.fail = lambda method, path, n: method == "GET" and n % 4 == 0  # every fourth request: 503
    dataset = StoreFiles(store, "loose", transform=lambda data, path: np.frombuffer(data[:4], np.uint8))
    batches = list(conveyor.DataLoader(dataset, batch_size=5, collate_fn=list, **kind))
    got = [bytes(a).hex() for batch in batches for a in batch]
    assert got == [data[:4].hex() for data in files.values()]
    assert any(status == 503 for _, _, status in s3.requests)  # failures happened, and were retried


def test_a_missing_object_is_not_retried_and_names_its_batch(s3, tmp_path):
    store = make_store(s3, tmp_path)
    upload(store, objects(6, "some"))
    dataset = StoreFiles(store, paths=["some/0000.bin", "some/0001.bin", "some/missing.bin", "some/0003.bin"])
    it = iter(conveyor.DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list))
    next(it)
    with pytest.raises(FileNotFoundError) as caught:
        next(it)
    assert caught.value.batch_index == 1
    assert len([p for _, p, _ in s3.requests if "missing" in p]) <= 2  # one attempt (a read, a listing), no retries


def test_a_store_that_keeps_failing_gives_up_with_a_count(s3, tmp_path):
    store = make_store(s3, tmp_path, retries=2)
    upload(store, objects(1, "one"))
    s3.fail = lambda method, path, n: method == "GET"
    with pytest.raises(OSError) as caught:
        store.read("one/0000.bin")
    assert "failed 3 times" in "".join(getattr(caught.value, "__notes__", []))
    assert sum(1 for m, _, status in s3.requests if m == "GET" and status == 503) >= 3


def test_a_connection_dropped_halfway_through_an_answer_is_retried_and_a_fetch_resumes(s3, tmp_path):
    store = make_store(s3, tmp_path, chunk_bytes=64 << 10)
    data = os.urandom(300_000)
    upload(store, {"big/one.bin": data})
    store.fs.retries = 1  # (s3fs's own retry loop off: every retry here is conveyor's)
    gets = []
    s3.drop = lambda method, path, n: method == "GET" and (gets.append(path) or len(gets)) in (1, 4)
    assert store.read("big/one.bin") == data  # (the first answer was cut off)
    with open(store.fetch("big/one.bin"), "rb") as f:  # (64 KB ranged reads; the third was cut off)
        assert f.read() == data
    statuses = [status for method, _, status in s3.requests if method == "GET"]
    # The read: cut off, then whole. The fetch: five ranged reads (206), the second cut off and asked again.
    assert statuses == [DROPPED, 200, 206, DROPPED, 206, 206, 206, 206]


def pack_and_upload(store: Store, tmp_path, samples=40, per_shard=8) -> str:
    root = tmp_path / "images"
    for i in range(samples):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(bytes([i]) * (2000 + 10 * i))
    local = tmp_path / "shards"
    assert cli(["pack", str(root), str(local), "--max-samples", str(per_shard)]) == 0
    upload(
        store,
        {f"shards/{name}": (local / name).read_bytes() for name in os.listdir(local) if not name.endswith(".tmp")},
    )
    return str(local)


def test_shards_in_the_store_read_as_local_ones_by_ranged_reads(s3, tmp_path):
    store = make_store(s3, tmp_path)
    local = pack_and_upload(store, tmp_path)
    remote = ShardDataset("shards", store=store)
    here = ShardDataset(local)
    assert len(remote) == len(here) == 40
    s3.requests.clear()
    for i in (0, 17, 39, 8):
        assert remote[i] == here[i]
    gets = [p for m, p, _ in s3.requests if m == "GET"]
    assert len(gets) == 4  # one ranged read per sample, no whole shard
    # Through a loader with spawn workers (the store travels pickled, without its connections).
    pickle.loads(pickle.dumps(remote))
    keys = [
        s["__key__"]
        for b in conveyor.DataLoader(
            remote, batch_size=8, shuffle=True, seed=0, num_workers=2, multiprocessing_context="spawn", collate_fn=list
        )
        for s in b
    ]
    assert sorted(keys) == [f"{i:09d}" for i in range(40)]


def test_a_stream_prefetches_shards_into_a_cache_that_keeps_to_its_size(s3, tmp_path):
    probe = make_store(s3, tmp_path)
    pack_and_upload(probe, tmp_path)
    shard_bytes = max(os.path.getsize(p) for p in (tmp_path / "shards").glob("*.tar"))
    # Room for 4 of the 5: the shard in hand, the two prefetched, and one already read (whichever of those
    # the least-recently-used order puts last); the fifth download evicts one already read.
    limit = 4 * shard_bytes + 1000
    store = make_store(s3, tmp_path, cache_bytes=limit)
    s3.requests.clear()
    s3.latency_s = 0.02
    stream = ShardDataset("shards", store=store, transform=lambda s: s["__key__"]).stream(prefetch=2)
    keys = list(conveyor.DataLoader(stream, batch_size=None))
    assert keys == [f"{i:09d}" for i in range(40)]
    cached = [f for f in os.listdir(tmp_path / "cache") if not f.endswith(".part")]
    assert sum(os.path.getsize(tmp_path / "cache" / f) for f in cached) <= limit
    whole = [p for m, p, _ in s3.requests if m == "GET" and p.endswith(".tar")]
    assert len(whole) == len(set(whole)) == 5  # each shard fetched once, whole
    store.close()


def test_a_missing_index_is_rebuilt_from_the_shard(s3, tmp_path):
    store = make_store(s3, tmp_path)
    local = tmp_path / "plain"
    local.mkdir()
    import webdataset

    with webdataset.TarWriter(str(local / "part-0.tar")) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": f"t{i}"})
    upload(store, {"plain/part-0.tar": (local / "part-0.tar").read_bytes()})
    remote = ShardDataset("plain", store=store)
    assert [remote[i]["txt"] for i in range(5)] == [f"t{i}" for i in range(5)]
