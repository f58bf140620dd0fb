"""Data in an object store (S3 and anything else fsspec reaches): reads
with retries, whole objects in a private local cache with a size limit,
prefetch.

    Store("s3://bucket/data", cache_bytes=20 << 30, endpoint_url=...)
      .read(path[, start, end])  one object (or a byte range), whole or an error, retried with backoff
      .fetch(path)               a local copy in the cache, streamed to disk in chunks,
                                 checked against the object's listing (size, MD5) and then
                                 against its record before use (least recently used go first);
                                 processes fetching the same object wait for one download
      .prefetch(paths)           fetch in the background (a few threads per process)
    StoreFiles(store)            a map-style dataset: object i's bytes
    ShardDataset("shards/", store=store)   shards in the store (shards/dataset.py)

    _retry.py     which failures are worth retrying (no import of botocore or aiohttp); the retry loop
    _whole.py     whole objects or an error: the bytes a store sent against the object's size and MD5
    _download.py  an object streamed into a local file in chunks, resumed after a dropped connection
    _cache.py     the cache folder: private to the user, entries beside their records, eviction
    _turns.py     one download of an object at a time across processes (a lock file per object)
    _store.py     Store and StoreFiles

Failures worth retrying (a dropped or refused connection, a timeout, a
body cut short or of other bytes than the object's, a store that failed
or is busy: see ``worth_retrying``; never a missing object or a refused
permission) are retried ``retries`` times in a row, waiting ``backoff_s``
× 2ⁿ (± half, so workers do not retry in step); the last error is raised
with a note saying how many attempts were made. A ``Store`` pickles
without its connections, and each process (each worker) makes its own on
first use. Reads in flight per worker are bounded by
``DataLoader(reads_in_flight=)``.
"""

from conveyor.store._retry import worth_retrying
from conveyor.store._store import Store, StoreFiles

__all__ = ["Store", "StoreFiles", "worth_retrying"]
