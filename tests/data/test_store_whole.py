"""Whole objects or an error: a store (here a proxy in front of moto's S3
server) that sends fewer or more bytes than the object, or other bytes of
the same length, as if they were the whole answer (Content-Length agrees,
no checksum header): every read path of a Store (``read`` whole and
ranged, ``fetch`` into the cache, ranged shard reads) retries it, and
after the last retry raises an error naming the object and the counts."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from conveyor.cli import main as cli  # noqa: E402
from conveyor.shards import ShardDataset  # noqa: E402
from conveyor.store import Store, worth_retrying  # noqa: E402
from object_store import BUCKET, CUT, GARBLED  # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.leaks_known("fsspec/s3fs keep an IO thread and pooled connections for the life of the process"),
]

SIZE = 300_000


@pytest.fixture
def s3(server):
    server.requests.clear()  # (the session's server: only this test's requests count)
    yield server
    server.cut, server.garble, server.unframed = None, None, False
    server.requests.clear()


def make_store(s3, tmp_path, **kwargs) -> Store:
    store = Store(
        f"s3://{BUCKET}", storage_options=s3.options(), cache_dir=str(tmp_path / "cache"), backoff_s=0.01, **kwargs
    )
    store.fs.retries = 1  # (s3fs's own retry loop off: every retry here is conveyor's)
    return store


def put(s3, store: Store, name: str, etag: str = "md5", size: int = SIZE) -> bytes:
    """Upload ``size`` random bytes as ``name``: in one part (its ETag is their MD5) or as a multipart upload
    of one part (an ETag with a "-1": no MD5 to check, only the size)."""
    data = np.random.default_rng(len(name)).integers(0, 256, size, dtype=np.uint8).tobytes()
    if etag == "md5":
        store.fs.pipe(store.url(name), data)
    else:
        import boto3

        client = boto3.client(
            "s3", endpoint_url=s3.url, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
        )
        upload = client.create_multipart_upload(Bucket=BUCKET, Key=name)["UploadId"]
        part = client.upload_part(Bucket=BUCKET, Key=name, UploadId=upload, PartNumber=1, Body=data)
        client.complete_multipart_upload(
            Bucket=BUCKET,
            Key=name,
            UploadId=upload,
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )
    listed = str(store.fs.info(store.url(name))["ETag"])
    assert ("-" in listed) == (etag == "multipart")
    s3.requests.clear()
    return data


def lie_to(name: str, k: int, gets: tuple = (1,)) -> object:
    """A ``cut`` for the proxy: the GETs of object ``name`` numbered ``gets`` (1 = its first; () = all) lie by ``k``."""
    seen = []

    def cut(method: str, path: str, n: int) -> int:
        if method != "GET" or not path.split("?")[0].endswith(f"/{name}"):
            return 0
        seen.append(path)
        return k if not gets or len(seen) in gets else 0

    return cut


def lies(s3) -> int:
    return sum(1 for _, _, status in s3.requests if status in (CUT, GARBLED))


def the_error(caught: pytest.ExceptionInfo) -> str:
    """The error's message with its notes (the retry loop's count of attempts is a note)."""
    return " ".join([str(caught.value), *getattr(caught.value, "__notes__", [])])


@pytest.mark.parametrize("etag", ["md5", "multipart"])
@pytest.mark.parametrize("framing", ["content-length", "unframed"])
@pytest.mark.parametrize("k", [100, -100], ids=["short", "long"])
def test_a_whole_read_cut_short_or_long_once_is_read_again_whole(s3, tmp_path, etag, framing, k):
    store = make_store(s3, tmp_path)
    data = put(s3, store, "whole.bin", etag)
    s3.cut, s3.unframed = lie_to("whole.bin", k), framing == "unframed"
    assert store.read("whole.bin") == data  # (not the 299,900 or 300,100 bytes of the first answer)
    assert lies(s3) == 1


@pytest.mark.parametrize("etag", ["md5", "multipart"])
@pytest.mark.parametrize("k", [100, -100], ids=["short", "long"])
def test_a_whole_read_always_cut_is_an_error_naming_the_object_and_the_counts(s3, tmp_path, etag, k):
    store = make_store(s3, tmp_path, retries=3)
    put(s3, store, "always.bin", etag)
    s3.cut = lie_to("always.bin", k, gets=())
    with pytest.raises(OSError) as caught:
        store.read("always.bin")
    said = the_error(caught)
    assert f"s3://{BUCKET}/always.bin" in said
    assert f"sent {SIZE - k:,} bytes where {SIZE:,} were due" in said
    assert "failed 4 times" in said
    assert lies(s3) == 4


@pytest.mark.parametrize("k", [100, -100], ids=["short", "long"])
def test_a_ranged_read_cut_short_or_long_is_read_again_then_an_error(s3, tmp_path, k):
    store = make_store(s3, tmp_path, retries=2)
    data = put(s3, store, "ranged.bin", "multipart")
    s3.cut = lie_to("ranged.bin", k)
    assert store.read("ranged.bin", 1_000, 201_000) == data[1_000:201_000]
    assert lies(s3) == 1
    assert store.read("ranged.bin", 299_000, 400_000) == data[299_000:]  # (the object ends there: no lie)
    s3.cut = lie_to("ranged.bin", k, gets=())
    with pytest.raises(OSError) as caught:
        store.read("ranged.bin", 1_000, 201_000)
    said = the_error(caught)
    assert f"s3://{BUCKET}/ranged.bin" in said and f"sent {200_000 - k:,} bytes where 200,000 were due" in said
    assert "failed 3 times" in said


def test_a_body_of_the_right_length_and_other_bytes_is_found_by_its_md5_etag(s3, tmp_path):
    store = make_store(s3, tmp_path, retries=2)
    data = put(s3, store, "garbled.bin", "md5")
    s3.garble = lambda method, path, n: method == "GET" and lies(s3) == 0
    assert store.read("garbled.bin") == data
    assert lies(s3) == 1
    s3.garble = lambda method, path, n: method == "GET"
    with pytest.raises(OSError) as caught:
        store.read("garbled.bin")
    said = the_error(caught)
    assert f"s3://{BUCKET}/garbled.bin" in said and "MD5" in said and "failed 3 times" in said


@pytest.mark.parametrize("lie", ["short", "long", "garbled"])
def test_a_fetch_never_hands_out_a_copy_of_other_bytes(s3, tmp_path, lie):
    # 64 KB chunks: five ranged GETs; the second lies. A long chunk without an MD5 to check (multipart)
    # would shift the bytes after it; a garbled one is found by the MD5 of the whole (its ETag).
    store = make_store(s3, tmp_path, chunk_bytes=64 << 10, retries=2)
    name = f"fetched-{lie}.bin"
    data = put(s3, store, name, "md5" if lie == "garbled" else "multipart")
    if lie == "garbled":
        gets: list = []
        s3.garble = lambda method, path, n: method == "GET" and (gets.append(n) or len(gets)) == 2
    else:
        s3.cut = lie_to(name, 100 if lie == "short" else -100, gets=(2,))
    with open(store.fetch(name), "rb") as f:
        assert f.read() == data
    assert lies(s3) == 1
    # Every answer a lie: an error naming the object, and nothing left in the cache.
    other = f"always-{lie}.bin"
    put(s3, store, other, "md5" if lie == "garbled" else "multipart")
    if lie == "garbled":
        s3.garble = lambda *_: True
    else:
        s3.cut = lie_to(other, 100 if lie == "short" else -100, gets=())
    with pytest.raises(OSError) as caught:
        store.fetch(other)
    said = the_error(caught)
    assert f"s3://{BUCKET}/{other}" in said and "failed 3 times" in said
    assert not [f for f in os.listdir(tmp_path / "cache") if other in f or f.endswith(".part")]


def test_a_shard_read_through_a_store_is_read_again_when_cut_short(s3, tmp_path):
    store = make_store(s3, tmp_path)
    root = tmp_path / "images"
    for i in range(12):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{i:03d}.bin").write_bytes(bytes([i]) * (3000 + 10 * i))
    local = tmp_path / "shards"
    assert cli(["pack", str(root), str(local), "--max-samples", "4"]) == 0
    for name in os.listdir(local):
        store.fs.pipe(store.url(f"shards/{name}"), (local / name).read_bytes())
    remote, here = ShardDataset("shards", store=store), ShardDataset(str(local))
    gets: list = []

    def cut(method: str, path: str, n: int) -> int:
        if method != "GET" or not path.split("?")[0].endswith(".tar") or "/shards/" not in path:
            return 0  # (only this test's shards: the session's server may serve another test's reads)
        gets.append(n)
        return 100 if len(gets) == 1 else 0

    s3.cut = cut
    for i in (0, 5, 11):
        gets.clear()
        assert remote[i] == here[i]  # (each sample's one ranged read: cut short, then asked again)
    assert sum(1 for _, path, status in s3.requests if status == CUT and "/shards/" in path) == 3


def test_which_etags_are_the_md5_of_the_bytes():
    from conveyor.store._whole import WrongBytes, check_md5, etag_md5

    md5 = "9e107d9d372bb6826bd81d3542a419d6"
    assert etag_md5({"ETag": f'"{md5}"'}) == md5 and etag_md5({"ETag": md5.upper()}) == md5
    for info in (
        {"ETag": f'"{md5[:-2]}-2"'},
        {"ETag": "abc"},
        {},
        {"ETag": md5, "ServerSideEncryption": "aws:kms"},
        {"ETag": md5, "SSECustomerAlgorithm": "AES256"},
    ):
        assert etag_md5(info) is None, info

    class S3:  # (what s3fs offers: its split of a path and a call of the S3 API; here a HEAD of the object)
        def __init__(self, encryption: dict):
            self.encryption = encryption

        def split_path(self, url):
            return url.split("/", 1) + [None]

        def call_s3(self, method, **kwargs):
            assert method == "head_object" and kwargs == {"Bucket": "b", "Key": "k.bin"}
            return {"ETag": f'"{md5}"', **self.encryption}

    info = {"ETag": f'"{md5}"', "size": 3}
    check_md5(S3({"ServerSideEncryption": "aws:kms"}), "b/k.bin", "s3://b/k.bin", info, 3, "0" * 32)  # (KMS: no MD5)
    with pytest.raises(WrongBytes, match="s3://b/k.bin: the MD5 of the 3 bytes") as caught:
        check_md5(S3({"ServerSideEncryption": "AES256"}), "b/k.bin", "s3://b/k.bin", info, 3, "0" * 32)
    assert worth_retrying(caught.value)
