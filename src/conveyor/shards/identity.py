"""Which file a path names, and what a dataset learned of each shard file.

    os.stat(path) ──▶ Identity (device, inode, size, mtime)
    ShardDataset(...) ──one stat per shard, taken before its index is read──▶ FileIdentities
        (a row of 32 bytes per shard, inherited by a forked worker, pickled to a spawned one)
    a process opens a shard ──▶ its identity compared with the one recorded (files.py)

Why a record made once, and not the identity a process sees when it opens
the file: a ``write()`` sets the file's mtime before it copies its pages,
so a process that opens a shard in the middle of a rewrite in place sees
the new mtime, reads a mix of old and new pages, and finds, after its
read, the mtime it opened: nothing it can stat tells it. Compared with the
dataset's record, that same file (device and inode) with another mtime or
size was changed in place since, whenever each process opens it.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np


class Identity(NamedTuple):
    """What says a path still names the file opened, unchanged: device, inode, size, mtime (ns)."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    def same_file(self, other: "Identity") -> bool:
        """Whether both are the same file (device and inode), whatever its size and mtime."""
        return self.device == other.device and self.inode == other.inode


def identity(st: os.stat_result) -> Identity:
    return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


#: One row per shard (device and inode as the kernel's unsigned 64-bit numbers).
_ROW = np.dtype([("device", "<u8"), ("inode", "<u8"), ("size", "<i8"), ("mtime_ns", "<i8")])


class FileIdentities:
    """Each shard file's identity when a dataset first learned of it, by
    shard number: 32 bytes a shard in one array (70,000 shards hold
    2.2 MB), so it costs nothing that matters to make, keep, fork or
    pickle. Read-only: what a process learns of a file since (a file
    renamed over, a change it refused) its ShardFiles keeps."""

    def __init__(self, stats: Sequence[os.stat_result]):
        self._rows = np.array([(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) for st in stats], dtype=_ROW)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, shard: int) -> Identity:
        return Identity(*self._rows[shard].item())


#: A dataset's record of one file: its FileIdentities and the file's number there (a pair, so that
#: a read passes it for the price of a tuple; the row, a few microseconds, is read only at an open).
MadeFor = tuple[FileIdentities, int]


__all__ = ["Identity", "identity", "FileIdentities", "MadeFor"]
