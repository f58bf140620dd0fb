"""An object streamed from a store into an open local file, chunk by chunk:
memory bounded by the chunk whatever the object's size, hashed on the way,
checked against the object's listing before it is handed out (_whole.py).

    copy_object(fs, url, source, into, info, chunk_bytes=..., retry=...) -> Copied(size, sha256, etag)

    attempt 1:  open ── read(chunk) ── as long as asked? ─▶ write + hash ── ... ── end: size == listing's?
                                                                                     MD5 == ETag (if one)? ─▶ Copied
    failure  :  retried by ``retry`` (a failure after progress starts its count again); a chunk of
                another length than asked for is never written; a wrong MD5 drops the bytes written
    attempt n:  the listing again ─┬─ the same version: reopen, seek to the bytes already written, go on
                                   └─ another version:  drop the bytes written, start over

Each ``read`` of a file opened with ``cache_type="none"`` is one ranged
request (for S3: a GET of ``chunk_bytes``), so nothing larger than a chunk
is held in memory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Optional

from conveyor.store._whole import WrongBytes, check_md5, check_size, etag_md5, listing, md5_hasher


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
    source: str,
    into: BinaryIO,
    info: dict,
    *,
    chunk_bytes: int,
    retry: Callable[[Callable[[], None], Callable[[], int]], None],
) -> Copied:
    """Stream object ``url`` of filesystem ``fs`` (``source`` in errors) into
    ``into`` (a binary file open for writing, empty), ``chunk_bytes`` at a
    time, each chunk and then the whole checked as _whole.py says. ``info``
    is the object's listing (fsspec's ``fs.info``), taken just before.
    ``retry(attempt, progress)`` calls ``attempt()`` again while it fails
    in a way worth retrying; each attempt resumes where the last stopped,
    or starts over when the object changed meanwhile."""
    download = _Download(fs, url, source, into, info, chunk_bytes)
    retry(download.attempt, lambda: download.size)
    return Copied(download.size, download.sha256.hexdigest(), version_tag(download.info))


class _Download:
    """One object on its way into a local file: the bytes written so far, their hashes, the listing they match."""

    def __init__(self, fs: Any, url: str, source: str, into: BinaryIO, info: dict, chunk_bytes: int):
        self.fs, self.url, self.source, self.into, self.chunk_bytes = fs, url, source, into, chunk_bytes
        self.attempts = 0
        self._start_over(info)

    def _start_over(self, info: dict) -> None:
        """Drop the bytes written; what comes next is checked against ``info``."""
        self.into.seek(0)
        self.into.truncate()
        self.info, self.size, self.sha256 = info, 0, hashlib.sha256()
        self.md5 = md5_hasher() if etag_md5(info) is not None else None  # (only where there is one to match)

    def attempt(self) -> None:
        self.attempts += 1
        if self.attempts > 1:
            self._look_again()
        expected = None if self.info.get("size") is None else int(self.info["size"])
        with self.fs.open(self.url, "rb", block_size=self.chunk_bytes, cache_type="none") as source:
            if self.size:
                source.seek(self.size)
            while expected is None or self.size < expected:
                want = self.chunk_bytes if expected is None else min(self.chunk_bytes, expected - self.size)
                block = source.read(want)
                if expected is None and not block:
                    break
                if expected is not None:
                    basis = f"bytes {self.size:,} to {self.size + want:,} of {expected:,}"
                    check_size(self.source, len(block), want, basis)  # (before it is written)
                self._write(block)
        if self.md5 is not None:
            try:
                check_md5(self.fs, self.url, self.source, self.info, self.size, self.md5.hexdigest())
            except WrongBytes:
                self._start_over(self.info)  # (which bytes are wrong is not known: all of them again)
                raise

    def _write(self, block: bytes) -> None:
        self.into.write(block)
        self.sha256.update(block)
        if self.md5 is not None:
            self.md5.update(block)
        self.size += len(block)

    def _look_again(self) -> None:
        """The object's listing anew (not one fsspec kept); when it is another
        version than the bytes written so far, those are dropped."""
        info = listing(self.fs, self.url, fresh=True)
        if _version(info) != _version(self.info):
            self._start_over(info)
        self.info = info
