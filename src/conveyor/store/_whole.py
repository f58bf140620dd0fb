"""Whole objects or an error: the bytes a store sent, checked against what
the store says the object is, before anyone sees them.

    a whole object:  its listing (size, ETag) ── GET ── as many bytes as its size? ── MD5 == ETag? ─▶ bytes
    a byte range:    GET ── as many bytes as asked for? ─▶ bytes
                             └─ fewer: its listing anew: does the object end there? ─▶ bytes
    a fetch:         each chunk as long as asked for; at the end, its size and MD5 (_download.py)
    anything else:   WrongBytes (an OSError: worth retrying), naming the object and both counts

A server or proxy may end a body early, or send more than the object,
without a dropped connection or a checksum header to give it away (its
Content-Length agrees with what it sent): the client's HTTP stack takes
it for the whole answer. Only the object's own record tells it apart.

Checksum: S3 gives the MD5 of an object's bytes as its ETag when it was
uploaded in one part and is not encrypted with SSE-KMS or SSE-C (those
ETags are not: a multipart one carries a ``-``, a KMS or SSE-C one looks
like an MD5 and is not). So an ETag is trusted only when it is 32 hex
digits, and a body whose MD5 differs from it is wrong only once a HEAD of
the object (asked for then, not before each read) shows no such
encryption. Other stores' tags are not compared.
"""

from __future__ import annotations

import errno
import hashlib
import re
from typing import Any, Optional

_MD5 = re.compile(r"[0-9a-f]{32}")
#: S3's server-side encryptions under which an object's ETag is not the MD5 of its bytes.
_ETAG_NOT_MD5 = frozenset({"aws:kms", "aws:kms:dsse"})


class WrongBytes(OSError):
    """The store sent other bytes than the object's record says: ``got``
    bytes where ``expected`` were due, or bytes with another checksum.
    Worth retrying (an ``OSError`` of errno ``EIO``)."""

    def __init__(self, source: str, got: int, expected: int, why: str):
        super().__init__(errno.EIO, f"conveyor: {source}: {why}")
        self.source, self.got, self.expected = source, got, expected


def md5_hasher() -> Any:
    """An MD5 hash to compare a body with its ETag (a checksum here, not a seal)."""
    return hashlib.md5(usedforsecurity=False)


def etag_md5(info: dict) -> Optional[str]:
    """The MD5 (hex) of the object's bytes that its listing (fsspec's
    ``info``) gives as its ETag, or None where it gives none that can be one.

    >>> etag_md5({"ETag": '"9e107d9d372bb6826bd81d3542a419d6"'}), etag_md5({"ETag": '"9e10...19d6-3"'})
    ('9e107d9d372bb6826bd81d3542a419d6', None)
    """
    if info.get("ServerSideEncryption") in _ETAG_NOT_MD5 or info.get("SSECustomerAlgorithm"):
        return None
    etag = str(info.get("ETag") or "").strip('"').lower()
    return etag if _MD5.fullmatch(etag) else None


def check_size(source: str, got: int, expected: Optional[int], basis: str) -> None:
    """WrongBytes unless ``got`` is ``expected`` (None: nothing to compare with)."""
    if expected is not None and got != expected:
        raise WrongBytes(source, got, expected, f"the store sent {got:,} bytes where {expected:,} were due ({basis})")


def check_md5(fs: Any, url: str, source: str, info: dict, size: int, digest: str) -> None:
    """WrongBytes unless ``digest``, the MD5 of the ``size`` bytes read of
    object ``url``, is the one its listing ``info`` gives (if it gives one)."""
    expected = etag_md5(info)
    if expected is None or digest == expected or _etag_not_md5(fs, url):
        return
    raise WrongBytes(
        source,
        size,
        int(info.get("size") or size),
        f"the MD5 of the {size:,} bytes the store sent is {digest}, where the object's ETag says {expected}",
    )


def _etag_not_md5(fs: Any, url: str) -> bool:
    """Whether S3 says (by a HEAD now) that the object is encrypted so that its ETag is not its MD5."""
    call_s3, split_path = getattr(fs, "call_s3", None), getattr(fs, "split_path", None)
    if call_s3 is None or split_path is None:
        return False
    bucket, key, _ = split_path(url)
    head = call_s3("head_object", Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption") in _ETAG_NOT_MD5 or bool(head.get("SSECustomerAlgorithm"))


def listing(fs: Any, url: str, fresh: bool) -> dict:
    """The object's listing (fsspec's ``info``); ``fresh``: not one fsspec kept from an earlier listing."""
    if fresh:
        invalidate = getattr(fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(url)
    return fs.info(url)


class Read:
    """One read of object ``url`` (whole, or bytes ``start`` to ``end`` as
    fsspec's ``cat_file`` takes them), whose ``attempt()`` returns the bytes
    only when they are the object's (see the module's docstring); an attempt
    after the first looks the object up anew."""

    def __init__(self, fs: Any, url: str, source: str, start: Optional[int], end: Optional[int]):
        self.fs, self.url, self.source, self.start, self.end = fs, url, source, start, end
        self.attempts = 0

    def attempt(self) -> bytes:
        self.attempts += 1
        if self.start is None and self.end is None:
            return self._whole()
        data = self.fs.cat_file(self.url, start=self.start, end=self.end)
        if self.start is not None and self.end is not None and 0 <= self.start <= self.end:
            if len(data) == self.end - self.start:
                return data  # (all that was asked for: no listing needed)
        size = int(listing(self.fs, self.url, fresh=True)["size"])  # (where the object ends, from the store)
        first, stop, _ = slice(self.start, self.end).indices(size)
        check_size(self.source, len(data), max(0, stop - first), f"bytes {first:,} to {stop:,} of {size:,}")
        return data

    def _whole(self) -> bytes:
        info = listing(self.fs, self.url, fresh=self.attempts > 1)
        data = self.fs.cat_file(self.url)
        size = info.get("size")
        check_size(self.source, len(data), None if size is None else int(size), "the object's size in its listing")
        if etag_md5(info) is not None:
            digest = md5_hasher()
            digest.update(data)
            check_md5(self.fs, self.url, self.source, info, len(data), digest.hexdigest())
        return data
