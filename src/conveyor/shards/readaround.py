"""Read-around for shard reads: what a memory map's page fault gets from the
kernel, asked for explicitly.

    first read in a window of a file ──posix_fadvise(WILLNEED, the window)──▶ the kernel
        reads the window into the page cache in the background; this read and the
        next ones in the window find their bytes there
    window = the read-ahead of the file's device (/sys/class/bdi/MAJ:MIN/read_ahead_kb,
        as a map's fault uses; 128 KB when it cannot be read), at most MAX_WINDOW
    a read that starts where the file's last read ended (a stream, files.py's IN_SEQUENCE) ──▶ the next window
        asked for too, so that its bytes come in while this window's are used

A ``pread`` at a random offset reads only the pages asked for: the kernel
sees no sequence to read ahead for. A map's fault reads a window around the
page (read-around), which, over a shard whose samples are all read, is what
makes a first shuffled pass fast. Read-around pays only when other reads
fall in the windows read: over a data set far larger than memory, read in a
random order, it multiplies the bytes read. A read-around asked for by
``posix_fadvise`` leaves no mark for the kernel's own read-ahead, so reads
in sequence (a stream) would wait for each window in turn: for them the
window after is asked for as the read enters one, as the kernel's
asynchronous read-ahead does for a map read in order. So the table keeps count, as the
kernel does for a map: windows asked for (misses) against reads that fell
in a window already asked for (hits); once misses outnumber hits by
``GIVE_UP`` it stops asking, and asks again if hits catch up.
"""

from __future__ import annotations

import os
from typing import Optional

#: The largest window asked for at once (a device may report a very large read-ahead).
MAX_WINDOW = 16 << 20
#: The window when the device's read-ahead cannot be read (the kernel's default).
DEFAULT_WINDOW = 128 << 10
#: Misses more than hits at which read-around stops (it has not paid).
GIVE_UP = 64

_ADVISE = getattr(os, "posix_fadvise", None)
_windows: dict[int, int] = {}  # device number -> window bytes


def window_of(device: int) -> int:
    """Bytes of read-around for files on ``device`` (0: none, where files cannot be advised)."""
    if _ADVISE is None:
        return 0
    known = _windows.get(device)
    if known is None:
        known = _windows[device] = min(MAX_WINDOW, _read_ahead(device) or DEFAULT_WINDOW)
    return known


def _read_ahead(device: int) -> Optional[int]:
    major, minor = os.major(device), os.minor(device)
    for place in (
        f"/sys/class/bdi/{major}:{minor}/read_ahead_kb",
        f"/sys/dev/block/{major}:{minor}/queue/read_ahead_kb",
        f"/sys/dev/block/{major}:{minor}/../queue/read_ahead_kb",
    ):
        try:
            with open(place) as f:
                return int(f.read()) * 1024
        except (OSError, ValueError):
            continue
    return None


class ReadAround:
    """One table's read-around: which windows of each file were asked for,
    and whether asking still pays. Counts are approximate under threads (a
    lost count changes only when asking stops)."""

    def __init__(self) -> None:
        self.misses = 0
        self.hits = 0

    def before_read(
        self, fd: int, advised: set[int], window: int, start: int, end: int, sequential: bool = False
    ) -> None:
        """Ask for the windows ``start`` to ``end`` of ``fd`` lies in, and the one after when the read
        is ``sequential`` (it starts where the last one ended), unless asked before (``advised``)."""
        if window == 0:
            return
        first, last = start // window, (end - 1) // window + (1 if sequential else 0)
        if first in advised and last in advised:
            self.hits += 1
            return
        if self.misses - self.hits > GIVE_UP:
            return
        for w in range(first, last + 1):
            if w not in advised:
                advised.add(w)
                self.misses += 1
                try:
                    _ADVISE(fd, w * window, window, os.POSIX_FADV_WILLNEED)  # type: ignore[misc]
                except OSError:
                    return


__all__ = ["ReadAround", "window_of", "MAX_WINDOW", "DEFAULT_WINDOW", "GIVE_UP"]
