"""Shared-memory slots: batches travel between processes without pickling
their bytes and without a fresh allocation per batch.

    main: SlotPool ── creates shared files, lends free slot k in a Task ──▶ any worker
    worker: SlotWriter(k) ── collate allocates in slot k (grows it if needed) ──▶ Batch header
    main: SlotPool.decode ── small leaves copied out, views on slot k for large ones (leases.py)
          ── user ── last large leaf dropped ──▶ slot k free again

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
    (``leases.SlotLease``). Only the main process decides which slot a task
    writes to, so a slot in use is never written.
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
from ...collate.convert import array_to_tensor
from .leases import OWN_COPY_MAX_BYTES, SlotLease, own_copy
from .tree import map_leaves

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
        self.end()


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


# ----------------------------------------------------------------- main side


class SlotPool:
    """Main side: every slot, which are free, and views on them.

    One pool serves all workers (any worker may write any free slot), so the
    slots in use at once are those in flight plus those the user holds, not
    a reserve per worker. Free slots are a stack: the most recently freed
    (already grown, warm in the caches) is lent first, so a steady loop
    touches only ``prefetch_factor × num_workers + 1`` of them.
    """

    def __init__(self, num_slots: int):
        self.fds: list[int] = create_slot_fds(num_slots)
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._maps: dict[int, mmap.mmap] = {}
        #: The lease of each slot whose batch was delivered and is not all gone yet.
        self._leases: dict[int, SlotLease] = {}
        self.closed = False

    def lend(self) -> Optional[int]:
        """A free slot for the next task, or None. Only the thread that runs
        the executor lends; list.pop and list.append are atomic, so the
        finalizers that give slots back (from any thread) need no lock.
        With none free, the slots the user keeps part of give back the pages
        of the leaves let go first (``leases.py``)."""
        if not self._free:
            self._punch_kept()
        return self._free.pop() if self._free else None

    @property
    def in_use(self) -> int:
        """Slots lent and not given back yet."""
        return len(self.fds) - len(self._free)

    def give_back(self, slot: Optional[int], emptied: bool = False) -> None:
        """Mark a slot free (its batch was dropped, or never used it). A slot
        grown past ``RELEASE_ABOVE_BYTES``, or with holes punched in it
        (``emptied``), gives its memory back first (the next batch to use it
        grows it again, as a fresh one would)."""
        if slot is None or self.closed:
            return
        try:
            if emptied or os.fstat(self.fds[slot]).st_size > RELEASE_ABOVE_BYTES:
                self._empty(slot)
        except (OSError, IndexError):
            pass  # (closed meanwhile, from another thread: nothing to give back)
        self._free.append(slot)

    def _empty(self, slot: int) -> None:
        """Truncate a slot that nothing uses (every view of its batch is gone)."""
        self._maps.pop(slot, None)
        os.ftruncate(self.fds[slot], 0)

    def _mapping(self, slot: int, size: int) -> mmap.mmap:
        current = self._maps.get(slot)
        if current is None or len(current) < size:
            # A smaller old mapping stays alive as long as arrays use it.
            current = mmap.mmap(self.fds[slot], size)
            self._maps[slot] = current
        return current

    def decode(self, data: Any, slot: int, slot_size: int, used: int) -> Any:
        """The batch with each :class:`Leaf` in place: a small one copied out
        of the slot, a large one a view on it (tensors for those that were
        tensors, by ``collate.array_to_tensor``). The slot is free again once
        every large leaf (and every view or tensor on one) is gone, at once if
        there is none (``leases.py``)."""
        try:
            mapping = self._mapping(slot, slot_size)
        except BaseException:  # (mmap: out of memory, say) the slot is free again
            self.give_back(slot)
            raise
        lease = SlotLease(slot, mapping, self._released)
        self._leases[slot] = lease

        def leaf(value: Any) -> Any:
            if not isinstance(value, Leaf):
                return value
            dtype = np.dtype(value.dtype)
            nbytes = math.prod(value.shape) * dtype.itemsize
            if nbytes <= OWN_COPY_MAX_BYTES:
                raw = own_copy(mapping, value.offset, nbytes)
            else:
                raw = lease.view(value.offset, nbytes)
            array = raw.view(dtype).reshape(value.shape)
            return array_to_tensor(array, value.torch_view) if value.torch else array

        try:
            return map_leaves(data, leaf)
        finally:
            lease.decoded()

    def _released(self, slot: int, emptied: bool) -> None:
        """(A lease's last leaf is gone, from any thread) the slot is free again."""
        self._leases.pop(slot, None)
        self.give_back(slot, emptied)

    def _punch_kept(self) -> None:
        """Give back the memory of the large leaves let go in slots that the
        user keeps part of (the pool is out of free slots, or closing)."""
        for lease in list(self._leases.copy().values()):
            if lease.punch() and not self.closed:
                self._empty(lease.slot)

    def close(self) -> None:
        """Close every descriptor (the workers are stopped). Mappings that
        batches still use stay valid; those kept in part give back the pages
        of the leaves let go."""
        self.closed = True
        self._punch_kept()
        self._leases.clear()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        self._maps.clear()
