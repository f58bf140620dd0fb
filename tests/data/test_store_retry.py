"""A Store retries what a retry may mend — a dropped or refused connection,
a timeout, a body cut short, a busy store — as the HTTP stacks under fsspec
raise it (botocore's, aiohttp's and fsspec's own classes, raised here by a
file system that fails on purpose), and never a missing object or a refused
permission. A fetch that loses its connection resumes where it stopped, or
starts over when the object changed meanwhile, and leaves nothing behind
when it gives up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conveyor.store import Store, worth_retrying
from store_fakes import FlakyFS

botocore = pytest.importorskip("botocore.exceptions")
aiohttp = pytest.importorskip("aiohttp")


def _answer(status: int, code: str):
    answer = {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.ClientError(answer, "GetObject")


def _response(status: int):
    import multidict
    import yarl

    url = yarl.URL("http://store.invalid/data/a.bin")
    info = aiohttp.RequestInfo(url, "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()), url)
    return aiohttp.ClientResponseError(info, (), status=status, message="answer")


RETRIED = {
    "EndpointConnectionError": lambda: botocore.EndpointConnectionError(endpoint_url="http://store.invalid"),
    "ConnectionClosedError": lambda: botocore.ConnectionClosedError(endpoint_url="http://store.invalid"),
    "ReadTimeoutError": lambda: botocore.ReadTimeoutError(endpoint_url="http://store.invalid"),
    "ConnectTimeoutError": lambda: botocore.ConnectTimeoutError(endpoint_url="http://store.invalid"),
    "ResponseStreamingError": lambda: botocore.ResponseStreamingError(error="connection reset"),
    "ClientConnectionError": lambda: aiohttp.ClientConnectionError("connection reset"),
    "ServerDisconnectedError": lambda: aiohttp.ServerDisconnectedError(),
    "ClientPayloadError": lambda: aiohttp.ClientPayloadError("Response payload is not completed"),
    "ClientOSError": lambda: aiohttp.ClientOSError(104, "Connection reset by peer"),
    "FSTimeoutError": lambda: __import__("fsspec.exceptions").exceptions.FSTimeoutError(),
    "ClientError 503 SlowDown": lambda: _answer(503, "SlowDown"),
    "ClientError 500": lambda: _answer(500, "InternalError"),
    "ClientResponseError 503": lambda: _response(503),
    "ClientResponseError 429": lambda: _response(429),
    "OSError from a 503": lambda: _from(OSError(5, "ServiceUnavailable"), _answer(503, "ServiceUnavailable")),
    "ConnectionResetError": lambda: ConnectionResetError(104, "Connection reset by peer"),
}

FINAL = {
    "FileNotFoundError": lambda: FileNotFoundError(2, "No such object"),
    "PermissionError": lambda: PermissionError(13, "Access denied"),
    "ClientError 404": lambda: _answer(404, "NoSuchKey"),
    "ClientError 403": lambda: _answer(403, "AccessDenied"),
    "ClientError 400": lambda: _answer(400, "InvalidArgument"),
    "ClientResponseError 404": lambda: _response(404),
    "ClientResponseError 403": lambda: _response(403),
    "OSError from a 400": lambda: _from(OSError(5, "InvalidRange"), _answer(400, "InvalidRange")),
    "a full disk": lambda: OSError(28, "No space left on device"),
    "a bug": lambda: TypeError("unsupported operand"),
}


def _from(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


DATA = bytes(range(256)) * 40 + b"tail"


def flaky_store(tmp_path, data: bytes = DATA, **kwargs) -> Store:
    folder = tmp_path / "data"
    folder.mkdir(exist_ok=True)
    (folder / "a.bin").write_bytes(data)
    return Store(f"flaky://{folder}", cache_dir=str(tmp_path / "cache"), backoff_s=0.001, **kwargs)


def calls(op: str) -> list:
    return [call[1:] for call in FlakyFS.calls if call[0] == op]


@pytest.mark.parametrize("make", RETRIED.values(), ids=RETRIED.keys())
def test_a_dropped_connection_or_a_busy_store_is_retried(tmp_path, make):
    assert worth_retrying(make())
    store = flaky_store(tmp_path)
    FlakyFS.reset(faults={"cat_file": [make(), make()]})
    assert store.read("a.bin") == DATA
    assert len(calls("cat_file")) == 3


@pytest.mark.parametrize("make", FINAL.values(), ids=FINAL.keys())
def test_a_missing_object_a_refused_permission_or_a_bug_is_raised_at_once(tmp_path, make):
    assert not worth_retrying(make())
    store = flaky_store(tmp_path)
    FlakyFS.reset(faults={"cat_file": [make()]})
    with pytest.raises(type(make())):
        store.read("a.bin")
    assert len(calls("cat_file")) == 1


def test_a_fetch_resumes_where_the_connection_dropped(tmp_path):
    store = flaky_store(tmp_path, chunk_bytes=1000)
    FlakyFS.reset(faults={"read": [None, None, None, RETRIED["ConnectionClosedError"]()]})
    local = store.fetch("a.bin")
    with open(local, "rb") as f:
        assert f.read() == DATA
    offsets = [offset for _, offset, _ in calls("read")]
    assert offsets[:6] == [0, 1000, 2000, 3000, 3000, 4000]  # (the read at 3000 failed; the next one resumed there)
    assert len(calls("open")) == 2
    assert not [name for name in os.listdir(tmp_path / "cache") if name.endswith(".part")]


def test_a_failure_after_progress_starts_the_count_again(tmp_path):
    store = flaky_store(tmp_path, chunk_bytes=1000, retries=1)
    drop = RETRIED["ServerDisconnectedError"]
    FlakyFS.reset(faults={"read": [None, drop(), None, drop(), None, drop(), None, drop()]})
    with open(store.fetch("a.bin"), "rb") as f:
        assert f.read() == DATA


def test_an_object_that_changed_while_it_was_fetched_is_fetched_again_whole(tmp_path):
    store = flaky_store(tmp_path, chunk_bytes=1000)
    newer = b"the newer version " * 300

    def replace_and_drop():
        (tmp_path / "data" / "a.bin").write_bytes(newer)
        return RETRIED["ClientPayloadError"]()

    FlakyFS.reset(faults={"read": [None, None, replace_and_drop]})
    with open(store.fetch("a.bin"), "rb") as f:
        assert f.read() == newer
    offsets = [offset for _, offset, _ in calls("read")]
    assert offsets[:4] == [0, 1000, 2000, 0]  # (the bytes of the older version were dropped)


def test_a_fetch_that_keeps_failing_gives_up_and_leaves_nothing(tmp_path):
    store = flaky_store(tmp_path, chunk_bytes=1000, retries=2)
    FlakyFS.reset(faults={"read": [None] + [RETRIED["EndpointConnectionError"]() for _ in range(5)]})
    with pytest.raises(botocore.EndpointConnectionError) as caught:
        store.fetch("a.bin")
    assert "failed 3 times" in "".join(caught.value.__notes__)  # (the first after a chunk, then 2 retries)
    assert os.listdir(tmp_path / "cache") == []


def test_a_missing_object_is_not_fetched_twice(tmp_path):
    store = flaky_store(tmp_path)
    FlakyFS.reset()
    with pytest.raises(FileNotFoundError):
        store.fetch("missing.bin")
    assert len(calls("info")) == 1 and not calls("open")


@pytest.mark.timeout(60)
def test_the_store_imports_neither_botocore_nor_aiohttp(tmp_path):
    (tmp_path / "a.bin").write_bytes(DATA)
    code = (
        "import sys; from conveyor.store import Store, worth_retrying\n"
        f"store = Store('file://{tmp_path}', cache_dir={str(tmp_path / 'cache')!r})\n"
        "assert open(store.fetch('a.bin'), 'rb').read() == store.read('a.bin')\n"
        "assert worth_retrying(ConnectionResetError()) and not worth_retrying(FileNotFoundError())\n"
        "print(sorted(m for m in ('botocore', 'aiohttp', 's3fs') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
