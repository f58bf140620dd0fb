"""Store (a folder of an object store, read through fsspec) and StoreFiles
(its objects as a map-style dataset)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Callable, Optional, Sequence

from conveyor.store._cache import Cache
from conveyor.store._download import Copied, copy_object
from conveyor.store._private import default_cache_dir, make_private
from conveyor.store._retry import retry
from conveyor.store._whole import Read

#: What ``verify_cached`` may be: how a cached copy this process did not write is checked before use.
_VERIFY = ("hash", "size")


class Store:
    """A folder of an object store, read through fsspec (``pip install
    fsspec s3fs`` for S3). ``storage_options`` (a dict) and any other
    keyword go to the filesystem (for s3fs: ``key``, ``secret``, ``anon``,
    ``client_kwargs={"endpoint_url": ...}``, and ``config_kwargs={"retries":
    {"max_attempts": 1}}`` to leave retrying to the Store).

    ``retries`` failures in a row worth retrying (see ``worth_retrying``)
    are retried, after ``backoff_s`` × 2ⁿ. ``fetch`` keeps whole objects in
    ``cache_dir`` (default: a folder of your own in the temporary folder),
    which must be private to you, within ``cache_bytes``; it streams each
    ``chunk_bytes`` at a time. ``verify_cached="hash"`` reads a cached copy
    whole to check its SHA-256 the first time a process uses one it did not
    fetch; ``"size"`` checks its size, inode and record only."""

    def __init__(
        self,
        url: str,
        *,
        cache_dir: Optional[str] = None,
        cache_bytes: int = 10 << 30,
        retries: int = 5,
        backoff_s: float = 0.05,
        prefetch_threads: int = 2,
        chunk_bytes: int = 8 << 20,
        verify_cached: str = "hash",
        storage_options: Optional[dict] = None,
        **options: Any,
    ):
        import fsspec

        if verify_cached not in _VERIFY:
            raise ValueError(f"Store(verify_cached={verify_cached!r}): give one of {', '.join(map(repr, _VERIFY))}")
        if chunk_bytes < 1:
            raise ValueError(f"Store(chunk_bytes={chunk_bytes}): give a positive number of bytes, e.g. 8 << 20")
        self.protocol, self.root = fsspec.core.split_protocol(url)
        self.protocol = self.protocol or "file"
        self.root = self.root.rstrip("/")
        self.storage_options = {**(storage_options or {}), **options}
        self.cache_dir = os.path.abspath(cache_dir) if cache_dir else default_cache_dir()
        if os.path.lexists(self.cache_dir):
            make_private(self.cache_dir)  # (a folder others may write is refused here, not in a worker)
        self.cache_bytes, self.retries, self.backoff_s = cache_bytes, retries, backoff_s
        self.prefetch_threads, self.chunk_bytes, self.verify_cached = prefetch_threads, chunk_bytes, verify_cached
        self._local: dict = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_local"] = {}  # (connections and threads stay in the process that made them)
        return state

    def _here(self) -> dict:
        """This process's filesystem, cache, prefetch pool and lock (made on first use; anew after a fork)."""
        if self._local.get("pid") != os.getpid():
            import fsspec

            self._local = {
                "pid": os.getpid(),
                "fs": fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.storage_options),
                "cache": None,
                "pool": None,
                "lock": threading.Lock(),
                "pending": {},
            }
        return self._local

    @property
    def fs(self) -> Any:
        return self._here()["fs"]

    def url(self, path: str) -> str:
        return f"{self.root}/{path.lstrip('/')}" if path else self.root

    # ------------------------------------------------------------- reading
    def retry(self, what: str, action: Callable[[], Any], progress: Optional[Callable[[], Any]] = None) -> Any:
        """``action()``, again after a pause while it fails in a way worth
        retrying (``progress``: see ``conveyor.store._retry.retry``)."""
        return retry(what, action, retries=self.retries, backoff_s=self.backoff_s, progress=progress)

    def read(self, path: str, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
        """Object ``path`` (relative to the store's folder), or its bytes ``start``
        to ``end``: all of them, checked against the object's listing (store/_whole.py)."""
        url = self.url(path)
        source = f"{self.protocol}://{url}"
        return self.retry(f"reading {source}", Read(self.fs, url, source, start, end).attempt)

    def list(self, prefix: str = "") -> list[str]:
        """Every object under ``prefix``, relative to the store's folder, sorted."""
        base = self.url(prefix)
        found = self.retry(f"listing {self.protocol}://{base}", lambda: self.fs.find(base))
        cut = len(self.root) + 1 if self.root else 0
        return sorted(str(p)[cut:] for p in found)

    # --------------------------------------------------------------- cache
    def fetch(self, path: str) -> str:
        """A local copy of object ``path`` in the cache, checked against its
        record (fetched if missing or if it disagrees; a copy being fetched
        in the background is waited for)."""
        here = self._here()
        with here["lock"]:
            pending = here["pending"].get(path)
        if pending is not None:
            pending.result()
        return self._download(path)

    def _cache(self) -> Cache:
        here = self._here()
        with here["lock"]:
            if here["cache"] is None:
                here["cache"] = Cache(self.cache_dir, self.cache_bytes, self.verify_cached)
            return here["cache"]

    def _download(self, path: str) -> str:
        cache, url = self._cache(), self.url(path)
        source = f"{self.protocol}://{url}"
        found = cache.lookup(source)
        if found is not None:
            return found
        with cache.turn(source):  # (one download of an object at a time: store/_turns.py)
            found = cache.lookup(source)
            return found if found is not None else self._copy(cache, url, source)

    def _copy(self, cache: Cache, url: str, source: str) -> str:
        """Download the object at ``url`` into a new entry of ``cache``."""
        info = self.retry(f"looking up {source}", lambda: self.fs.info(url))
        cache.evict(incoming_bytes=int(info.get("size") or 0))  # (room first, so the download fits too)

        def fill(into: BinaryIO) -> Copied:
            def retrying(attempt: Callable[[], None], progress: Callable[[], int]) -> None:
                self.retry(f"fetching {source}", attempt, progress)

            return copy_object(self.fs, url, source, into, info, chunk_bytes=self.chunk_bytes, retry=retrying)

        return cache.add(source, fill)

    def release(self, path: str) -> None:
        """Say that this process is done with object ``path``'s cached copy
        (a stream finished its shard): the copy is the first to make room
        for a download, before the copies still in use or fetched ahead; it
        stays usable until then."""
        self._cache().release(f"{self.protocol}://{self.url(path)}")

    def prefetch(self, paths: Sequence[str]) -> None:
        """Start fetching ``paths`` in the background (at most ``prefetch_threads`` at once)."""
        here = self._here()
        with here["lock"]:
            if here["pool"] is None:
                here["pool"] = ThreadPoolExecutor(self.prefetch_threads, thread_name_prefix="conveyor-prefetch")
            for path in paths:
                if path not in here["pending"]:
                    here["pending"][path] = here["pool"].submit(self.fetch_quietly, path)

    def fetch_quietly(self, path: str) -> None:
        """``fetch`` for the background: a failure is left for the foreground fetch to meet again."""
        try:
            self._download(path)
        except Exception:
            pass
        finally:
            with self._here()["lock"]:
                self._here()["pending"].pop(path, None)

    def close(self) -> None:
        """Stop this process's prefetch threads."""
        pool = self._local.get("pool") if self._local.get("pid") == os.getpid() else None
        if pool is not None:
            pool.shutdown(wait=True)
            self._local["pool"] = None

    def __repr__(self) -> str:
        return f"Store({self.protocol}://{self.root})"


class StoreFiles:
    """A map-style dataset of objects in a store: sample ``i`` is the bytes
    of the ``i``-th object under ``prefix`` (sorted), or ``transform(bytes,
    path)``. Use ``DataLoader(reads_in_flight=N)`` to keep N reads in
    flight per worker, and ``worker_method="thread"`` for many workers."""

    def __init__(
        self,
        store: Store,
        prefix: str = "",
        paths: Optional[Sequence[str]] = None,
        transform: Optional[Callable[[bytes, str], Any]] = None,
    ):
        self.store = store
        self.paths = list(paths) if paths is not None else store.list(prefix)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        path = self.paths[i]
        data = self.store.read(path)
        return self.transform(data, path) if self.transform is not None else data
