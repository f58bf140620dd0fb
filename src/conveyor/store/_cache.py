"""The Store's local cache: whole objects in a folder private to the user,
each beside a record of what it was fetched as, within a size limit.

    cache_dir/                              0700 and yours, or refused (checked once per process)
      <key>-<name>                          an entry: the object's bytes                      0600
      <key>.record                          what the entry was fetched as (JSON)              0600
      <key>.<pid>-<start>.<thread>.part     a download in progress (or a record's draft)      0600
      <key>.lock                            held while one process downloads it (_turns.py)   0600

    <key>: the first 16 hex digits of the SHA-256 of the object's URL; <name>: its base name;
    <pid>-<start>: the writing process and when it started (so a reused pid is told apart).

Writing: the object streams into its .part file; once whole, the .part is
renamed over the entry, then the record is written (as a .part, renamed
over the record). A download that fails or is killed never leaves an entry.

Using: an entry is handed out only when its record names the same URL and
the entry is a regular file of yours, of the recorded size and inode (a
file put there, copied or renamed over it has another). The first time a
process uses an entry it did not write, it also reads the whole file and
compares its SHA-256 with the record (``Store(verify_cached="hash")``):
one pass over each copy per process, the only check that finds bytes
changed in place; ``"size"`` skips it. An entry that disagrees is removed
and fetched again, with a warning naming it; one without a record is
fetched again.

Room: before and after each download, the ``.part`` files of processes
that are gone are removed, and the least recently used entries with their
records (by access time, which a use sets and a release clears: readers
check a copy by its modification time), until entries, records and the
downloads in progress fit ``limit_bytes``; a lock file that a killed
download left (a few bytes, not counted) is removed once nobody holds it
(_turns.py). Files with other names are neither counted nor touched. A
writer is gone when /proc shows no process of its pid and start time, so
the processes sharing a cache folder must share a pid namespace
(containers: give each its own ``cache_dir``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
from dataclasses import asdict, dataclass
from typing import BinaryIO, Callable, ContextManager, Optional

from conveyor.store._download import Copied
from conveyor.store._private import make_private
from conveyor.store._turns import remove_if_free, turn

log = logging.getLogger("conveyor")

#: The record's format; a record of another format is not trusted (its entry is fetched again).
_FORMAT = "conveyor-store-cache/1"
#: How much of a file a record may be: a record is a short JSON object; anything longer is not one.
_RECORD_MAX_BYTES = 64 << 10
#: Chunk of a hash check's read: memory per check.
_HASH_CHUNK_BYTES = 8 << 20
#: Entries this process checked by hash, remembered so that each is read once; beyond this many,
#: the oldest are forgotten (and read again if used again).
_VERIFIED_MAX = 1 << 16

_ENTRY = re.compile(r"([0-9a-f]{16})-.+")
_RECORD = re.compile(r"([0-9a-f]{16})\.record")
_PART = re.compile(r"([0-9a-f]{16})\.(\d+)-(\d+)\.(\d+)\.part")
_LOCK = re.compile(r"([0-9a-f]{16})\.lock")

#: The names of the .part files this process is writing now (unique to an object and a thread).
_WRITING: set = set()
#: (device, inode, size, sha256) of the entries this process wrote or checked by hash.
_VERIFIED: dict = {}


@dataclass(frozen=True)
class Record:
    """What an entry was fetched as: the object's URL (``source``), its
    ``size`` in bytes, the ``inode`` of the file written, the ``sha256``
    (hex) of its bytes, and the store's ``etag`` of that version, if any."""

    source: str
    size: int
    inode: int
    sha256: str
    etag: Optional[str]

    def encode(self) -> bytes:
        return json.dumps({"format": _FORMAT, **asdict(self)}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Optional["Record"]:
        """The record in ``data``, or None when it is not one of this format."""
        try:
            fields = json.loads(data)
        except ValueError:
            return None
        types: dict[str, type | tuple[type, ...]] = {
            "format": str,
            "source": str,
            "size": int,
            "inode": int,
            "sha256": str,
            "etag": (str, type(None)),
        }
        if not isinstance(fields, dict) or set(fields) != set(types) or fields["format"] != _FORMAT:
            return None
        if not all(isinstance(fields[k], t) and not isinstance(fields[k], bool) for k, t in types.items()):
            return None
        del fields["format"]
        return cls(**fields)


class Cache:
    """The cache folder ``folder`` as one process uses it: entries are looked
    up with ``lookup``, made with ``add``, and removed by ``evict`` to keep
    within ``limit_bytes``. ``verify`` is "hash" or "size" (see the module's
    docstring). Making one checks that the folder is private (or creates it)
    and removes what killed downloads left."""

    def __init__(self, folder: str, limit_bytes: int, verify: str):
        self.folder, self.limit_bytes, self.verify = folder, limit_bytes, verify
        make_private(folder)
        self.evict()

    def entry(self, source: str) -> str:
        """Where the entry for the object at URL ``source`` is."""
        name = os.path.basename(source.rstrip("/"))[-100:] or "object"
        return os.path.join(self.folder, f"{_key(source)}-{name}")

    def turn(self, source: str) -> ContextManager[bool]:
        """Hold ``source``'s turn to be downloaded, across processes and
        threads (_turns.py): look it up again once held."""
        key = _key(source)
        return turn(self.folder, key, _part_name(key))

    # ------------------------------------------------------------------ using
    def lookup(self, source: str) -> Optional[str]:
        """The entry for ``source`` if conveyor wrote it and it agrees with its
        record (touched: used last); else None. One that disagrees is removed."""
        entry = self.entry(source)
        try:
            found = os.lstat(entry)
        except FileNotFoundError:
            return None
        record = self._read_record(_key(source))
        if record is None:
            return None  # (an older cache's, a download's in the middle of being recorded: fetched again)
        problem = _disagreement(found, record, source)
        if problem is None and self.verify == "hash" and _seen(found, record) not in _VERIFIED:
            problem = _hash_disagreement(entry, found, record)
        if problem is not None:
            log.warning("the cached copy %s of %s is not used: %s; fetching it again", entry, source, problem)
            _remove(entry)
            return None
        try:
            os.utime(entry, ns=(time.time_ns(), found.st_mtime_ns))  # (evicted last; mtime kept: readers check it)
        except FileNotFoundError:  # (evicted by another process just now)
            return None
        return entry

    def release(self, source: str) -> None:
        """Mark ``source``'s entry the first to be evicted (a reader is done
        with it): its access time set to the epoch's start, 1970. It stays
        usable until evicted, and a later use marks it used again."""
        entry = self.entry(source)
        try:
            os.utime(entry, ns=(0, os.lstat(entry).st_mtime_ns), follow_symlinks=False)
        except FileNotFoundError:
            pass

    def _read_record(self, key: str) -> Optional[Record]:
        try:
            fd = os.open(os.path.join(self.folder, f"{key}.record"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                return None
            data = f.read(_RECORD_MAX_BYTES + 1)
        return Record.decode(data) if len(data) <= _RECORD_MAX_BYTES else None

    # ----------------------------------------------------------------- adding
    def add(self, source: str, fill: Callable[[BinaryIO], Copied]) -> str:
        """A new entry for ``source``: ``fill(file)`` writes the object into a
        new private file and says what it wrote; the file becomes the entry,
        and gets its record, only once ``fill`` returns. On any failure nothing
        is left behind. Returns the entry."""
        key, entry = _key(source), self.entry(source)
        name = _part_name(key)
        part = os.path.join(self.folder, name)
        _WRITING.add(name)
        try:
            with _create_private(part) as f:
                copied = fill(f)
                f.flush()
                written = os.fstat(f.fileno())
            if written.st_size != copied.size:
                raise OSError(f"conveyor: {part} holds {written.st_size} bytes where {copied.size} were written")
            record = Record(source, copied.size, written.st_ino, copied.sha256, copied.etag)
            os.replace(part, entry)
            with _create_private(part) as f:
                f.write(record.encode())
            os.replace(part, os.path.join(self.folder, f"{key}.record"))
        finally:
            _WRITING.discard(name)
            _remove(part)
        _remember(_seen(written, record))
        self.evict(keep=entry)
        return entry

    # --------------------------------------------------------------- evicting
    def evict(self, keep: Optional[str] = None, incoming_bytes: int = 0) -> None:
        """Make the folder fit ``limit_bytes`` with ``incoming_bytes`` more to
        come: remove the .part files of processes that are gone, records
        without an entry, then the least recently used entries (but ``keep``)
        with their records."""
        entries, records, locks, total = [], {}, set(), 0
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            part, record, entry = _PART.fullmatch(name), _RECORD.fullmatch(name), _ENTRY.fullmatch(name)
            lock = _LOCK.fullmatch(name)
            if lock:
                locks.add(lock.group(1))
                continue
            if part and not _writer_alive(part):
                _remove(path)
                continue
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(found.st_mode):
                continue
            if part:
                total += found.st_size
            elif record:
                records[record.group(1)] = (path, found.st_size)
            elif entry:
                entries.append((found.st_atime, path, found.st_size, entry.group(1)))
                total += found.st_size
        keys = {key for *_, key in entries}
        for key, (path, size) in list(records.items()):
            if key in keys:
                total += size
            else:
                _remove(path)
                del records[key]
        for _, path, size, key in sorted(entries):
            if total + incoming_bytes <= self.limit_bytes:
                break
            if path == keep:
                continue
            _remove(path)
            keys.discard(key)
            record_path, record_size = records.pop(key, (None, 0))
            if record_path is not None:
                _remove(record_path)
            total -= size + record_size
        for key in locks - keys:
            remove_if_free(self.folder, key)


def _key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _part_name(key: str) -> str:
    """The .part file this process's thread writes object ``key`` into."""
    return f"{key}.{_writer()}.{threading.get_ident()}.part"


def _disagreement(found: os.stat_result, record: Record, source: str) -> Optional[str]:
    """What in an entry's ``lstat`` disagrees with its record, or None."""
    if record.source != source:
        return f"its record is for {record.source}"
    if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
        return "it is not a plain file of yours"
    if found.st_size != record.size:
        return f"it has {found.st_size} bytes where its record says {record.size}"
    if found.st_ino != record.inode:
        return "it is not the file conveyor wrote (another inode)"
    return None


def _hash_disagreement(entry: str, found: os.stat_result, record: Record) -> Optional[str]:
    """Read ``entry`` whole: None if its SHA-256 is the record's (remembered), else what disagrees."""
    digest = hashlib.sha256()
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "it was removed while it was checked"
    with os.fdopen(fd, "rb") as f:
        if os.fstat(fd).st_ino != found.st_ino:
            return "it was replaced while it was checked"
        while block := f.read(_HASH_CHUNK_BYTES):
            digest.update(block)
    if digest.hexdigest() != record.sha256:
        return f"its SHA-256 {digest.hexdigest()} is not the recorded {record.sha256}"
    _remember(_seen(found, record))
    return None


def _seen(found: os.stat_result, record: Record) -> tuple:
    return found.st_dev, found.st_ino, found.st_size, record.sha256


def _remember(seen: tuple) -> None:
    _VERIFIED[seen] = True
    while len(_VERIFIED) > _VERIFIED_MAX:
        _VERIFIED.pop(next(iter(_VERIFIED)), None)


def _create_private(path: str) -> BinaryIO:
    """A new file at ``path`` (never an existing one, never through a link), readable by you alone."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def _remove(path: str) -> bool:
    """Remove ``path``; whether it was there to remove."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------ writers
_ME: dict = {}


def _writer() -> str:
    """This process as a .part file's name gives it: its pid and when it started."""
    pid = os.getpid()
    if _ME.get("pid") != pid:
        _ME.update(pid=pid, tag=f"{pid}-{_started(pid) or 0}")
    return _ME["tag"]


def _writer_alive(part: re.Match) -> bool:
    """Whether the process that writes this .part file still runs (for this
    process: whether one of its threads is writing it now)."""
    pid, started = int(part.group(2)), part.group(3)
    if f"{pid}-{started}" == _writer():
        return part.group(0) in _WRITING
    return _started(pid) == started


def _started(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks after boot, from /proc), or
    None when it is not running (gone, or a zombie). Without /proc: "0"
    for any process that exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "0"
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()
