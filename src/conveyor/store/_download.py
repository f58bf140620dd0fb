"""An object streamed from a store into an open local file, chunk by chunk:
memory bounded by the chunk whatever the object's size, hashed on the way.

    copy_object(fs, url, into, info, chunk_bytes=..., retry=...) -> Copied(size, sha256, etag)

    attempt 1:  open ── read(chunk) ─▶ write + hash ── ... ── end: size == listing's? ─▶ Copied
    failure  :  retried by ``retry`` (a failure after progress starts its count again)
    attempt n:  the listing again ─┬─ the same version: reopen, seek to the bytes already written, go on
                                   └─ another version:  drop the bytes written, start over

Each ``read`` of a file opened with ``cache_type="none"`` is one ranged
request (for S3: a GET of ``chunk_bytes``), so nothing larger than a chunk
is held in memory.
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Optional


@dataclass(frozen=True)
class Copied:
    """What an object was fetched as: ``size`` in bytes, ``sha256`` (hex)
    of those bytes, and ``etag``, the store's tag of that version of the
    object when its listing gives one (S3's ETag), else None."""

    size: int
    sha256: str
    etag: Optional[str]


def version_tag(info: dict) -> Optional[str]:
    """The store's tag of this version of an object, from fsspec's ``info`` (S3's ETag, GCS's generation)."""
    for key in ("ETag", "etag", "generation", "VersionId"):
        if info.get(key) is not None:
            return str(info[key])
    return None


def _version(info: dict) -> tuple:
    """What tells two versions of an object apart: its size with its tag, or with its time of change."""
    return info.get("size"), version_tag(info) or str(info.get("mtime", info.get("LastModified", "")))


def copy_object(
    fs: Any,
    url: str,
    into: BinaryIO,
    info: dict,
    *,
    chunk_bytes: int,
    retry: Callable[[Callable[[], None], Callable[[], int]], None],
) -> Copied:
    """Stream object ``url`` of filesystem ``fs`` into ``into`` (a binary
    file open for writing, empty), ``chunk_bytes`` at a time. ``info`` is
    the object's listing (fsspec's ``fs.info``), taken just before.
    ``retry(attempt, progress)`` calls ``attempt()`` again while it fails
    in a way worth retrying; each attempt resumes where the last stopped,
    or starts over when the object changed meanwhile."""
    download = _Download(fs, url, into, info, chunk_bytes)
    retry(download.attempt, lambda: download.size)
    return Copied(download.size, download.sha256.hexdigest(), version_tag(download.info))


class _Download:
    """One object on its way into a local file: the bytes written so far, their hash, the listing they match."""

    def __init__(self, fs: Any, url: str, into: BinaryIO, info: dict, chunk_bytes: int):
        self.fs, self.url, self.into, self.info, self.chunk_bytes = fs, url, into, info, chunk_bytes
        self.size, self.sha256, self.attempts = 0, hashlib.sha256(), 0

    def attempt(self) -> None:
        self.attempts += 1
        if self.attempts > 1:
            self._look_again()
        with self.fs.open(self.url, "rb", block_size=self.chunk_bytes, cache_type="none") as source:
            if self.size:
                source.seek(self.size)
            while True:
                block = source.read(self.chunk_bytes)
                if not block:
                    break
                self.into.write(block)
                self.sha256.update(block)
                self.size += len(block)
        expected = self.info.get("size")
        if expected is not None and self.size != expected:
            raise OSError(errno.EIO, f"{self.size} bytes of {self.url} arrived where its listing says {expected}")

    def _look_again(self) -> None:
        """The object's listing anew (not one fsspec kept); when it is another
        version than the bytes written so far, those are dropped."""
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(self.url)
        info = self.fs.info(self.url)
        if _version(info) != _version(self.info):
            self.into.seek(0)
            self.into.truncate()
            self.size, self.sha256 = 0, hashlib.sha256()
        self.info = info
