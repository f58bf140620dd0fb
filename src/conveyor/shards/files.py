"""Open shard files, a bounded few per process, read by ``os.pread`` and
checked to be the file that was opened.

    read(path, start, end) ──pin──▶ its open file (LRU of ``limit``; opened, checked against
                                    the index's tar size, when not held)
                           ──os.pread(end - start bytes at start)──▶ bytes
                           ──fstat──▶ same size, mtime and inode as at open? and every byte came?
                           ──unpin──▶ (an evicted file is closed by its last reader)
                           ──▶ the bytes, or a ShardError naming the shard (its file is let go:
                               the next read opens it anew)

Why ``pread`` and not memory maps: a map's pages vanish when its file is
cut short under it, and touching them is a SIGBUS that kills the
interpreter (and every thread in it); a read returns what is there, and
its byte count and the file's ``fstat`` after it say whether that is the
file and the bytes the index was made for. A rewrite in place (a new
mtime) between or during reads, a truncation, a shrink: each is a
ShardError, never a sample of mixed bytes. A file replaced by rename (a
folder swapped in, a restored copy) is seen by a ``stat`` of its path at
the next read: the new file is opened and checked against the index. One
``stat``, one ``pread`` and one ``fstat`` per sample; a map cost a page
fault per page instead (bench/shards.py measures both). What no stat can
tell: a file opened while another program is in the middle of one write
to it (the write's new mtime came before its bytes) can give that write's
bytes; each member's tar header is still checked, and ``conveyor pack
--verify`` hashes the whole tar.

Why a bounded table: a file held open per shard ever read runs out of file
descriptors (``ulimit -n``) with thousands of shards, and out of maps
(``vm.max_map_count``) with tens of thousands. At most ``limit`` files are
held (plus, briefly, one per thread reading a file just evicted: an fd is
closed only when no thread is reading it, so its number is never reused by
another file mid-read). A forked child drops its parent's table and opens
its own; a pickled table travels empty.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from .errors import VERIFY_HINT, ShardError

#: Files one process holds open at most (trade-off: re-opening a shard costs an open+fstat per
#: eviction; 32 covers a stream's shard per worker thread and a shuffled read's hot set).
OPEN_FILES = 32


@dataclass(frozen=True)
class Identity:
    """What says a file is still the one opened: device, inode, size, mtime (ns)."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def identity(st: os.stat_result) -> Identity:
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Open:
    """One open file: its descriptor, identity at open, readers at work, and
    whether it left the table. It owns its descriptor: closed once, by
    ``close`` or when the entry is collected (a dataset let go of)."""

    __slots__ = ("fd", "identity", "pins", "evicted")

    def __init__(self, fd: int, ident: Identity):
        self.fd, self.identity, self.pins, self.evicted = fd, ident, 0, False

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class ShardFiles:
    """A process's open shard files, at most ``limit`` (least recently read
    closed first), safe to read from many threads at once. Ownership: the
    table opens each file and closes it once it is evicted or forgotten and
    no reader holds it."""

    def __init__(self, limit: int = OPEN_FILES):
        if limit < 1:
            raise ValueError(f"ShardFiles: limit is {limit}; hold at least 1 open file")
        self.limit = limit
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._table: OrderedDict[str, _Open] = OrderedDict()
        self._pid = os.getpid()

    def read(self, path: str, start: int, end: int, tar_bytes: int, name: Optional[str] = None) -> bytes:
        """Bytes ``start`` to ``end`` of ``path``, a shard whose index was made
        for ``tar_bytes`` bytes; a ShardError (naming ``name`` or ``path``)
        when the file is not that size, changed since it was opened, or gave
        fewer bytes."""
        shown = name or path
        entry = self._pin(path, tar_bytes, shown)
        if _replaced(path, entry.identity):  # (renamed over since it was opened: read the new file, checked anew)
            self._unpin(entry)
            self.forget(path)
            entry = self._pin(path, tar_bytes, shown)
        try:
            data = os.pread(entry.fd, end - start, start)
            now = identity(os.fstat(entry.fd))
        except OSError as exc:
            self.forget(path)
            raise ShardError(f"{shown}: cannot be read ({exc.strerror or exc}); restore it ({VERIFY_HINT})") from exc
        finally:
            self._unpin(entry)
        if now != entry.identity or len(data) != end - start:
            self.forget(path)
            raise ShardError(
                f"{shown}: changed while it was read ({_change(entry.identity, now, len(data), end - start)}): "
                f"another program rewrote, truncated or replaced it; restore the shard (the next read opens it "
                f"anew) or pack again ({VERIFY_HINT})"
            )
        return data

    def forget(self, path: str) -> None:
        """Let go of ``path``'s open file (closed now, or by its last reader)."""
        with self._lock:
            entry = self._table.pop(path, None) if self._pid == os.getpid() else None
            if entry is not None:
                self._evict(entry)

    def held(self) -> int:
        """How many files the table holds open now."""
        return len(self._table) if self._pid == os.getpid() else 0

    def _pin(self, path: str, tar_bytes: int, shown: str) -> _Open:
        if self._pid != os.getpid():  # (forked: the parent's descriptors are not this process's to use)
            self._drop_inherited()
        with self._lock:
            entry = self._table.get(path)
            if entry is None:
                entry = self._table[path] = _opened(path, tar_bytes, shown)
                while len(self._table) > self.limit:
                    self._evict(self._table.popitem(last=False)[1])
            else:
                self._table.move_to_end(path)
            entry.pins += 1
            return entry

    def _unpin(self, entry: _Open) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.evicted and entry.pins == 0:
                entry.close()

    def _evict(self, entry: _Open) -> None:
        """(under the lock) ``entry`` left the table: close it unless a reader holds it."""
        entry.evicted = True
        if entry.pins == 0:
            entry.close()

    def _drop_inherited(self) -> None:
        """In a forked child: close this process's copies of the parent's descriptors, start a new table."""
        inherited = list(self._table.values())
        self._reset()
        for entry in inherited:
            try:
                entry.close()
            except OSError:
                pass

    def __getstate__(self) -> dict:
        return {"limit": self.limit}

    def __setstate__(self, state: dict) -> None:
        self.limit = state["limit"]
        self._reset()


def _opened(path: str, tar_bytes: int, shown: str) -> _Open:
    """``path`` opened read-only, once its size is the one its index was made for."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        ident = identity(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    if ident.size != tar_bytes:
        os.close(fd)
        raise ShardError(
            f"{shown}: {ident.size} bytes now, its index was made for {tar_bytes}: the shard changed since the "
            f"dataset was opened (or its local copy is not the object); restore it or open the dataset again "
            f"({VERIFY_HINT})"
        )
    return _Open(fd, ident)


def _replaced(path: str, opened: Identity) -> bool:
    """Whether ``path`` now names another file than the one opened (a file
    unlinked since, such as a cache's evicted copy, is still read whole)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) != (opened.device, opened.inode)


def _change(before: Identity, now: Identity, got: int, wanted: int) -> str:
    if got != wanted:
        return f"{got} of {wanted} bytes read; the file has {now.size} bytes, {before.size} when it was opened"
    if now.size != before.size:
        return f"{now.size} bytes now, {before.size} when it was opened"
    return "its modification time or inode is not the one it had when it was opened"


__all__ = ["ShardFiles", "OPEN_FILES", "Identity", "identity"]
