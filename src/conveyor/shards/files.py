"""Open shard files, a bounded few per process, read by ``os.pread`` and
checked to be the file that was opened.

    read(path, start, end) ──▶ its open file (LRU of ``limit``; when not held, opened and checked:
                               the same file as the dataset's record (identity.py) with another
                               mtime or size? refused; another file? its size the index's)
                           ──read-around: the window it lies in asked for once (readaround.py)
                           ──os.pread(end - start bytes at start)──▶ bytes
                           ──fstat──▶ the file of the size and mtime it had at open? and
                               every byte came?
                           ──stat(path), when the file has no link left (or once a second)──▶
                               another file renamed over the path? (let go, the new one
                               opened and read)
                           ──▶ the bytes, or a ShardError naming the shard (its file is let go:
                               the next read opens it anew)

Why ``pread`` and not memory maps: a map's pages vanish when its file is
cut short under it, and touching them is a SIGBUS that kills the
interpreter (and every thread in it); a read returns what is there, and
its byte count and an ``fstat`` after it say whether those are the bytes
of the file the index was made for. A rewrite in place (a new mtime)
between or during reads, a truncation, a shrink: each is a ShardError,
never a sample of mixed bytes. A file replaced by rename (a folder swapped
in, a restored copy) leaves the file opened without a link: the same
``fstat`` shows it, the path is looked up and the new file opened, checked
against the index and read (a file with other hard links is looked for
every ``PATH_CHECK_S``). One ``pread`` and one
``fstat`` per read, and one ``posix_fadvise`` per window of read-around
(the bytes around a read that a map's page fault would have read, asked
for while that pays: readaround.py); a map cost a page fault per page
instead (bench/shards.py measures both). A file opened while another
program is in the middle of one write to it would show that write's new
mtime (set before its bytes are copied) at open and after each read alike:
so each open is compared with the identity the dataset recorded when it
was made (``made_for``; identity.py), and the same file with another mtime
or size is refused however late a process first opens it (a worker that
starts late, a file the table let go); a store's local copy has no record
(its cache replaces a copy only by rename), it is checked from its open on.
A refusal, and a file renamed over
the path, become that process's record: the next read opens the file as
it is then. What no stat can tell: a file that process accepted so (it
may still be in the middle of a write), a change within one tick of the
file system's clock, a rewrite that restores the mtime; each member's tar
header is still checked, and ``conveyor pack --verify`` hashes the whole
tar.

Why a bounded table: a file held open per shard ever read runs out of file
descriptors (``ulimit -n``) with thousands of shards, and out of maps
(``vm.max_map_count``) with tens of thousands. At most ``limit`` files are
held, plus, briefly, one per thread still reading a file just evicted: a
descriptor is closed when its last reference goes (the table's, or a
reader's), so its number is never reused by another file mid-read. A
forked child drops its parent's table and opens its own; a pickled table
travels empty.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Optional

from .errors import VERIFY_HINT, ShardError
from .identity import Identity, MadeFor, identity
from .readaround import ReadAround, window_of

#: Files one process holds open at most (trade-off: re-opening a shard costs an open+fstat per
#: eviction; 32 covers a stream's shard per worker thread and a shuffled read's hot set).
OPEN_FILES = 32


#: A read that starts at most this many bytes after the file's last read ended is in sequence
#: (a stream's next run: the tar's padding between a member's end and the next header lies between).
IN_SEQUENCE = 4096


#: Seconds between looks at whether a held file's path names another file now (renamed over a file
#: that keeps other hard links; one renamed over without them is seen at once by its link count).
PATH_CHECK_S = 1.0


class _Open:
    """One open file: its descriptor, identity at open and read-around
    (its device's window, the windows asked for, where its last read ended). It owns its descriptor,
    closed when the last reference to it goes (the table's and every
    reader's), or by ``close``."""

    __slots__ = ("fd", "identity", "window", "advised", "last_end", "path_due")

    def __init__(self, fd: int, ident: Identity):
        self.fd, self.identity = fd, ident
        self.window, self.advised = window_of(ident.device), set[int]()
        self.last_end = -1  # (where the last read of it ended: a read from there on is in sequence)
        self.path_due = time.monotonic() + PATH_CHECK_S  # (when to look whether the path names another file)

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
    let go first), safe to read from many threads at once. Ownership: the
    table opens each file; an entry it lets go of is closed by its last
    reader. What it learned of a file since its dataset's record (a
    refusal, a file renamed over) it keeps per path, through fork and
    pickle."""

    def __init__(self, limit: int = OPEN_FILES):
        if limit < 1:
            raise ValueError(f"ShardFiles: limit is {limit}; hold at least 1 open file")
        self.limit = limit
        self._seen: dict[str, Identity] = {}  # (a file's identity this process took since its dataset's record)
        self._reset()
        _TABLES.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._table: OrderedDict[str, _Open] = OrderedDict()
        self._around = ReadAround()

    def read(
        self,
        path: str,
        start: int,
        end: int,
        tar_bytes: int,
        name: Optional[str] = None,
        made_for: Optional[MadeFor] = None,
    ) -> bytes:
        """Bytes ``start`` to ``end`` of ``path``, a shard whose index was made
        for ``tar_bytes`` bytes; a ShardError (naming ``name`` or ``path``)
        when the file is not that size, changed since it was opened, or gave
        fewer bytes, or, opened, is the file of ``made_for`` (the identity
        its dataset recorded, identity.py) with another mtime: changed in place
        since. A file renamed over ``path`` is opened and read instead (seen
        by the opened file's link count, and by a look at the path every
        ``PATH_CHECK_S``). After a refusal the next read opens the file as
        it is then."""
        entry = self._entry(path, tar_bytes, name or path, made_for)
        try:
            if entry.window:
                self._around.before_read(
                    entry.fd, entry.advised, entry.window, start, end, 0 <= start - entry.last_end <= IN_SEQUENCE
                )
            entry.last_end = end
            data = os.pread(entry.fd, end - start, start)
            st = os.fstat(entry.fd)
            now = time.monotonic()  # (a file renamed over has no link left; a hard-linked one is looked for in time)
            renamed = (st.st_nlink == 0 or now >= entry.path_due) and _renamed_over(path, entry, now)
        except OSError as exc:
            del entry  # (closed with the table's reference, not kept by this frame's traceback)
            self.forget(path)
            raise ShardError(
                f"{name or path}: cannot be read ({exc.strerror or exc}); restore it ({VERIFY_HINT})"
            ) from exc
        opened = entry.identity
        if len(data) == end - start and st.st_size == opened.size and st.st_mtime_ns == opened.mtime_ns:
            if not renamed:
                return data
            del entry
            self.forget(path)  # (renamed over: the new file is opened, checked and read)
            return self.read(path, start, end, tar_bytes, name, made_for)
        del entry
        self.forget(path)
        if made_for is not None:  # (refused: this process's record now, so the next read opens the file as it is)
            self._seen[path] = identity(st)
        raise ShardError(
            f"{name or path}: changed while it was read ({_change(opened, identity(st), len(data), end - start)}): "
            f"another program rewrote, truncated or replaced it; restore the shard (the next read opens it anew) or "
            f"pack again ({VERIFY_HINT})"
        )

    def forget(self, path: str) -> None:
        """Let go of ``path``'s open file (closed now, or by its last reader)."""
        with self._lock:
            self._table.pop(path, None)

    def held(self) -> int:
        """How many files the table holds open now."""
        return len(self._table)

    def _entry(self, path: str, tar_bytes: int, shown: str, made_for: Optional[MadeFor]) -> _Open:
        """``path``'s open file: the one held, else opened now (the least recently read let go)."""
        entry = self._table.get(path)
        if entry is not None:
            try:
                self._table.move_to_end(path)
            except KeyError:  # (another thread let it go since: this reader's reference keeps it open)
                pass
            return entry
        with self._lock:
            entry = self._table.get(path)
            if entry is None:
                entry = self._table[path] = self._opened(path, tar_bytes, shown, made_for)
                while len(self._table) > self.limit:
                    self._table.popitem(last=False)
            return entry

    def _opened(self, path: str, tar_bytes: int, shown: str, made_for: Optional[MadeFor]) -> _Open:
        """``path`` opened, once its size is the one its index was made for and it is not the recorded file
        (``made_for``, or what this process took since) with another mtime."""
        entry = _opened(path, tar_bytes, shown)
        if made_for is None:
            return entry
        record, now = self._seen.get(path), entry.identity
        if record is None:
            identities, n = made_for
            record = identities[n]
        if now.same_file(record) and now != record:
            entry.close()
            self._seen[path] = now  # (refused: the next read opens the file as it is then)
            raise ShardError(
                f"{shown}: rewritten in place since the dataset was opened (the same file of the same size, its "
                f"modification time changed; it may be in the middle of a write); restore it by renaming a whole copy "
                f"over it, or open the dataset again once the write is done (this process's next read takes the file "
                f"as it is then; a worker started later compares it with the dataset's record); {VERIFY_HINT}"
            )
        if now != record:
            self._seen[path] = now  # (another file, renamed over the path: this process's record from now on)
        return entry

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
        return {"limit": self.limit, "seen": dict(self._seen)}

    def __setstate__(self, state: dict) -> None:
        self.limit, self._seen = state["limit"], dict(state.get("seen", {}))
        self._reset()
        _TABLES.add(self)


#: Every table in this process, for a forked child to drop what it inherited.
_TABLES: weakref.WeakSet[ShardFiles] = weakref.WeakSet()


def _drop_inherited_tables() -> None:
    for table in list(_TABLES):
        table._drop_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_tables)


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


def _renamed_over(path: str, entry: _Open, now: float) -> bool:
    """Whether ``path`` names another file than the one ``entry`` opened (a
    path that is gone does not: a file unlinked since, such as a cache's
    evicted copy, is still read whole). Not asked again for PATH_CHECK_S."""
    entry.path_due = now + PATH_CHECK_S
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) != (entry.identity.device, entry.identity.inode)


def _change(before: Identity, now: Identity, got: int, wanted: int) -> str:
    if got != wanted:
        return f"{got} of {wanted} bytes read; the file has {now.size} bytes, {before.size} when it was opened"
    if now.size != before.size:
        return f"{now.size} bytes now, {before.size} when it was opened"
    return "its modification time is not the one it had when it was opened"


__all__ = ["ShardFiles", "OPEN_FILES", "Identity", "identity"]
