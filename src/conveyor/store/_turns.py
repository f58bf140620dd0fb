"""One download of an object at a time, across the processes and threads
that share a cache folder.

    <key>.lock    empty but for the name of its holder's .part file;
                  held (flock) by whoever downloads the object now     0600

A fetch that finds no entry takes the object's turn before downloading it,
then looks again: the holder before it may have just added the entry, which
it then uses instead of downloading the object a second time. While another
holds the turn, it waits as long as that download makes progress (its
``.part`` file grows). A holder that makes none for ``stall_s`` (stopped,
or stuck on the network) is waited for no longer: the fetch downloads the
object itself, as it would without turns (both downloads are whole and
checked; the entry is renamed into place by each). A holder that dies lets
go of its turn at once (the kernel drops its lock).

The holder removes the lock file as it lets go of it; the cache's
eviction removes one that a killed holder left, once nobody holds it
(_cache.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from typing import Iterator, Optional

log = logging.getLogger("conveyor")

#: How long a fetch waits for another's download of the same object that makes no progress.
STALL_S = 30.0
#: How often a waiting fetch looks at the holder's progress.
_POLL_S = 0.05
#: The longest holder's name a lock file holds (a .part file's name is shorter).
_NAME_MAX = 255


def lock_path(folder: str, key: str) -> str:
    return os.path.join(folder, f"{key}.lock")


@contextlib.contextmanager
def turn(folder: str, key: str, part_name: str, stall_s: Optional[float] = None) -> Iterator[bool]:
    """Hold object ``key``'s turn to download (``part_name``: the .part file
    this fetch would write, told to those who wait); yields whether it is
    held (False: the holder made no progress for ``stall_s``, default
    STALL_S, and this fetch goes ahead anyway)."""
    stall_s = STALL_S if stall_s is None else stall_s
    path = lock_path(folder, key)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        held = _wait_for_turn(fd, folder, stall_s)
        if held:
            os.ftruncate(fd, 0)
            os.pwrite(fd, part_name.encode(), 0)
        try:
            yield held
        finally:
            if held:
                _unlink_if_same(path, fd)  # (while held: those waiting on it go on, and nothing is left)
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _wait_for_turn(fd: int, folder: str, stall_s: float) -> bool:
    progress: Optional[int] = None
    stalls_at = time.monotonic() + stall_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as exc:  # (a file system without locks: every fetch downloads, as without turns)
            log.debug("no turns in %s: %s", folder, exc)
            return False
        now = time.monotonic()
        size = _holder_bytes(fd, folder)
        if size is not None and size != progress:
            progress, stalls_at = size, now + stall_s
        elif now >= stalls_at:
            log.warning(
                "another download of the same object into %s made no progress for %.0f s; downloading it here too",
                folder,
                stall_s,
            )
            return False
        time.sleep(_POLL_S)


def _holder_bytes(fd: int, folder: str) -> Optional[int]:
    """How far the holder's download has got (None: not known yet)."""
    name = os.pread(fd, _NAME_MAX + 1, 0).decode(errors="replace")
    if not name or "/" in name or len(name) > _NAME_MAX:
        return None
    try:
        return os.lstat(os.path.join(folder, name)).st_size
    except (FileNotFoundError, ValueError):
        return None


def remove_if_free(folder: str, key: str) -> None:
    """Remove object ``key``'s lock file unless someone holds it (one that a
    killed holder left)."""
    path = lock_path(folder, key)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _unlink_if_same(path, fd)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)  # (drops the lock)


def _unlink_if_same(path: str, fd: int) -> None:
    """Remove ``path`` if it is still the file open as ``fd``. A fetch that
    opened it just before waits on it, gets it once it is let go, and finds
    the entry made meanwhile; one that opens the path later makes a new
    lock file, and at worst downloads alongside (never wrong: each download
    is whole and checked)."""
    try:
        if os.lstat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except FileNotFoundError:
        pass
