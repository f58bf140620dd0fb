"""Shared-memory slots: batches travel between processes without pickling
their bytes and without a fresh allocation per batch.

    main: SlotPool (slot_pool.py) ── creates shared files, lends free slot k in a Task ──▶ any worker
    worker: SlotWriter(k) ── collate allocates in slot k (grows it if needed) ──▶ Batch header
    main: SlotPool.decode (slot_pool.py) ── small leaves copied out, views on slot k for large
          ones (leases.py) ── user ── last large leaf dropped ──▶ slot k free again

Ownership rule:
  * The main process creates every slot (an anonymous ``memfd``, or where
    there is none a POSIX shared-memory object unlinked at once, see
    ``_engine/portable.py``: no file in /dev/shm, and the kernel frees the memory
    when the last descriptor and mapping are gone, whichever process dies)
    before the workers start; every worker inherits the descriptors of every
    slot (one pool serves them all).
  * A slot belongs to the worker from the moment a Task names it until the
    worker's Batch arrives; then to the main process while any large leaf
    (array or tensor) handed to the user refers to it; then it is free. Small
    leaves are copied out at delivery and hold nothing of it; the pages of a
    slot that only some kept leaves use go back to the system
    (``leases.SlotLease``), and a slot kept in part is retired: its file
    stays with the kept leaves alone and the slot gets a fresh one, which
    the workers open when a task names it (``SlotWriters``). Only the main
    process decides which slot a task writes to, so a slot in use is never
    written.
  * Only the worker grows a slot (``ftruncate`` + ``posix_fallocate``, so a
    full memory fails there with an error instead of a Bus error later;
    ``portable.resize_shared_file``); the main process maps the new size
    when a header says so.
"""

from __future__ import annotations

import math
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..portable import resize_shared_file, shared_memory_file

#: Arrays start at multiples of this (cache lines, and what SIMD loads like).
_ALIGN_BYTES = 64
#: Slots grow by at least this factor, so a growing batch size remaps rarely.
_GROWTH_FACTOR = 1.5
#: Batches smaller than this travel inside the header instead: mapping views
#: and tracking their lifetime costs more than copying a few kilobytes.
INLINE_MAX_BYTES = 32 * 1024
#: Slots beyond the prefetch_factor × num_workers in flight: one for the
#: batch the user holds, the rest for users who keep a few batches. Unused
#: slots cost a file descriptor and no memory (they are never grown).
SPARE_SLOTS = 3
#: A worker keeps slots up to this size mapped between tasks: mapping and
#: populating a slot for each task cost a worker more than stacking the batch
#: into it (bench a: 3.7 -> 4.7 GB/s). A kept slot's pages count in that
#: worker's RSS as well as the main process's (the memory itself is shared,
#: counted once by PSS and by a cgroup's limit); bigger slots are mapped per
#: task, so that a few huge batches are not counted twice.
_KEEP_MAPPED_MAX_BYTES = 64 << 20
#: A slot grown past this gives its memory back once its batch is dropped.
#: Kept, a few batches of gigabytes each would hold that much memory for
#: good, and the job's other allocations would need fresh pages (bench l);
#: growing it again costs what a fresh allocation costs anyway, which is
#: small next to what such a batch takes to make.
RELEASE_ABOVE_BYTES = 256 << 20
#: Map slots with their pages in place (one call instead of a fault per page).
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: How often a worker holding its first batch looks whether the batch it
#: waits for is done (StopFlag.wait_while_filling): a wake-up costs
#: microseconds, and the wait is tens of milliseconds.
_FILLING_POLL_S = 0.0005
#: numpy dtype kinds that can live in shared memory.
PLAIN_KINDS = "biufcmM"


class SlotFull(Exception):
    """The slot could not grow (the system is out of shared memory)."""


def create_slot_fds(count: int) -> list[int]:
    """``count`` empty anonymous memory files (raises OSError where the
    system has no anonymous shared memory)."""
    fds = []
    try:
        for _ in range(count):
            fds.append(shared_memory_file("slot"))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@dataclass(frozen=True)
class Leaf:
    """Where one array of a batch lies in its slot."""

    offset: int
    shape: tuple
    dtype: str
    torch: bool  # hand it out as a torch tensor
    #: A torch dtype numpy lacks (bfloat16, ...): the bytes travel as an
    #: integer array of the same width and are viewed back as this dtype.
    torch_view: Optional[str] = None


class SlotWriter:
    """Worker side of one slot: a bump allocator over a growable shared file.

    A slot up to ``_KEEP_MAPPED_MAX_BYTES`` stays mapped between tasks; a
    bigger one is mapped for one task at a time (``begin`` .. ``end``), with
    its pages populated in one call (about a tenth of a millisecond per MB),
    so that it does not count twice in the job's resident memory (worker
    and main).
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self._map: Optional[mmap.mmap] = None
        self._current: tuple = ()
        self._offset = 0
        #: id() of each array handed out this task -> (array, offset): the fast path of offset_of.
        self._carved: dict[int, tuple] = {}
        self._maps: list[tuple[int, int, Any]] = []  # (address, size, mmap) usable this task
        #: Why the slot could not grow, once; the batch then travels inline.
        self.full: Optional[str] = None

    def begin(self) -> None:
        """Start a batch: map the slot, allocations begin at offset 0 again."""
        size = os.fstat(self.fd).st_size  # another worker may have grown it
        self._offset = 0
        self._carved = {}
        self._maps = []
        if size != self.size or self._map is None:
            self.size = size
            self._map = None
            if size:
                self._remap()
        if self._map is not None:
            self._maps.append(self._current)

    def end(self) -> None:
        """The batch has been sent: let go of a big slot's mapping (it is
        unmapped once the last array on it is gone); others stay mapped,
        since mapping again would cost more than they weigh."""
        self._maps = []
        self._carved = {}
        if self.size > _KEEP_MAPPED_MAX_BYTES:
            self._map = None
            self._current = ()

    @property
    def used(self) -> int:
        return self._offset

    def _grow(self, needed: int) -> None:
        # (an eighth more than needed: room for the small leaves that follow a
        # big one, labels after images, without growing twice for one batch)
        new_size = _round_up(max(needed + needed // 8, int(self.size * _GROWTH_FACTOR)), mmap.PAGESIZE)
        try:
            resize_shared_file(self.fd, new_size)
        except OSError as exc:
            raise SlotFull(f"cannot grow a shared-memory slot to {new_size} bytes: {exc}") from exc
        self.size = new_size
        self._remap()
        # Arrays already carved from the old mapping stay valid: same file.
        self._maps.append(self._current)

    def _remap(self) -> None:
        self._map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED | _MAP_POPULATE)
        self._current = (_address(np.frombuffer(self._map, np.uint8)), self.size, self._map)

    def allocate(self, shape: tuple, dtype: Any) -> np.ndarray:
        """An uninitialised array in this slot (the collate ``allocate`` hook);
        an ordinary array if the slot cannot grow (it then travels inline)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        start = _round_up(self._offset, _ALIGN_BYTES)
        if start + nbytes > self.size:
            try:
                self._grow(start + nbytes)
            except SlotFull as exc:
                self.full = str(exc)
                return np.empty(shape, dtype)
        self._offset = start + nbytes
        array = np.ndarray(shape, dtype=dtype, buffer=self._map, offset=start)
        self._carved[id(array)] = (array, start)
        return array

    def offset_of(self, array: np.ndarray) -> Optional[int]:
        """The file offset of ``array`` if it was carved from this slot this task."""
        carved = self._carved.get(id(array))
        if carved is not None and carved[0] is array:
            return carved[1]
        if not array.flags.c_contiguous:
            return None
        address = _address(array)
        for base, size, _ in self._maps:
            if base <= address and address + array.nbytes <= base + size:
                return address - base
        return None

    def close(self) -> None:
        """Let go of the mapping (it is unmapped once the last array on it is gone)."""
        self.end()
        self._map = None
        self._current = ()


class SlotWriters:
    """A worker's writer of each slot. When the main process has retired a
    slot's file (kept leaves live on in it alone, ``slot_pool.py``), the
    task says where the new one is (``Task.slot_file``: its generation and a
    /proc path to the main process's descriptor), and the worker opens it in
    place of the old one; where it cannot, the batch travels inline."""

    def __init__(self, fds: tuple):
        self._writers: list[Optional[SlotWriter]] = [SlotWriter(fd) for fd in fds]
        self._files: list[Optional[tuple[int, str]]] = [None] * len(fds)

    def for_task(self, slot: Optional[int], file: Optional[tuple[int, str]]) -> Optional[SlotWriter]:
        """The writer of ``slot`` as the task names it; None: send the batch inline."""
        if slot is None:
            return None
        if file != self._files[slot]:
            self._reopen(slot, file)
        return self._writers[slot]

    def _reopen(self, slot: int, file: Optional[tuple[int, str]]) -> None:
        old, self._writers[slot] = self._writers[slot], None
        self._files[slot] = file
        if old is not None:
            old.close()
            os.close(old.fd)  # (this worker's descriptor of the retired file)
        if file is None:
            return
        try:
            fd = os.open(file[1], os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return  # (no /proc access here: this slot's batches travel inline)
        self._writers[slot] = SlotWriter(fd)


class StopFlag:
    """One shared page of flags. Byte 0: the main process tells every worker
    to stop before its next task, without waiting behind the tasks already
    queued in its pipe (the main process creates it and sets it; workers
    only read it). Byte 1: the worker filling an epoch's first batch with a
    thread per core says so (``filling``), and the other workers hold their
    own first batch until it is done (``wait_while_filling``), so that the
    batch the loop waits for has every core."""

    def __init__(self, fd: Optional[int] = None):
        self.owner = fd is None
        self.fd = shared_memory_file("stop") if fd is None else fd
        if self.owner:
            try:
                os.ftruncate(self.fd, mmap.PAGESIZE)
            except BaseException:
                os.close(self.fd)
                raise
        self._map = mmap.mmap(self.fd, mmap.PAGESIZE)

    def set(self) -> None:
        self._map[0] = 1

    def is_set(self) -> bool:
        return self._map[0] == 1

    def filling(self, on: bool) -> None:
        """(A worker) it is filling an epoch's first batch with every core (``on``), or no longer."""
        self._map[1] = 1 if on else 0

    def wait_while_filling(self, limit_s: float) -> bool:
        """(A worker) wait while another fills an epoch's first batch with every
        core, at most ``limit_s``, and not once the stop flag is up; whether
        it waited until that batch was done."""
        if self._map[1] == 0:
            return False
        deadline = time.monotonic() + limit_s
        while self._map[1] and not self._map[0]:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_FILLING_POLL_S)
        return not self._map[0]

    def close(self) -> None:
        """Let go of the map (which holds a descriptor of its own) and, for
        the owner, the file."""
        self._map.close()
        if self.owner:
            try:
                os.close(self.fd)
            except OSError:
                pass
