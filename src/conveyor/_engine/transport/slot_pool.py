"""The main process's side of the shared-memory slots (slots.py): which are
free, the batches delivered on them, and the slots the user keeps part of.

    lend(k) ──Task(slot k, slot_file)──▶ worker ──Batch──▶ decode: SlotLease(k) (leases.py) ──▶ user
    last large leaf of k gone ──▶ give_back(k) ──▶ free
    each lend ──▶ a slot partly kept (seen so twice) gives back its dropped leaves' pages; with no
                  slot free, it is retired: its file stays with the kept leaves alone, slot k gets a
                  fresh file (the next worker to write it opens that through /proc) and is free again

Retiring keeps a user who keeps a large leaf of every batch (masks beside
images) from holding every slot: without it, the pool would run dry and the
next batches would travel pickled through the pipe. A retired file keeps
one descriptor (its mapping's) while its leaves live, so at most
``RETIRED_MAX`` are kept; past that, or where workers cannot open a file
through /proc (macOS), a partly kept slot only gives its pages back and
stays out of use until its leaves go.
"""

from __future__ import annotations

import math
import mmap
import os
from typing import Any, Optional

import numpy as np

from ...collate.convert import array_to_tensor
from ..portable import shared_memory_file
from . import slots
from .leases import OWN_COPY_MAX_BYTES, SlotLease, own_copy
from .slots import Leaf, create_slot_fds
from .tree import map_leaves

#: Retired slot files alive at once (each holds a descriptor while kept
#: leaves live in it): far below the usual limit of 1024 descriptors.
RETIRED_MAX = 256


class SlotPool:
    """Main side: every slot, which are free, and views on them.

    One pool serves all workers (any worker may write any free slot), so the
    slots in use at once are those in flight plus those the user holds, not
    a reserve per worker. Free slots are a stack: the most recently freed
    (already grown, warm in the caches) is lent first, so a steady loop
    touches only ``prefetch_factor × num_workers + 1`` of them.

    Ownership rule: the pool creates every slot's file, and closes it when
    it closes or retires the slot; a retired file is then owned by the
    mapping its kept leaves lie on, and goes with the last of them.
    """

    def __init__(self, num_slots: int):
        self.fds: list[int] = create_slot_fds(num_slots)
        #: Per slot, once its first file was retired: (generation, path) of its file now, for the workers.
        self.files: list[Optional[tuple[int, str]]] = [None] * num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._maps: dict[int, mmap.mmap] = {}
        #: The lease of each slot whose batch was delivered and is not all gone yet.
        self._leases: dict[int, SlotLease] = {}
        self._seen_partly_kept: set[SlotLease] = set()
        self._retired: set[SlotLease] = set()
        self._generation = 0
        self._can_retire = os.path.isdir(f"/proc/{os.getpid()}/fd")
        self.closed = False

    def lend(self) -> Optional[int]:
        """A free slot for the next task, or None. Only the thread that runs
        the executor lends; list.pop and list.append are atomic, so the
        finalizers that give slots back (from any thread) need no lock.
        Slots the user keeps part of are looked at first (``_look``)."""
        self._look()
        return self._free.pop() if self._free else None

    @property
    def in_use(self) -> int:
        """Slots lent and not given back yet."""
        return len(self.fds) - len(self._free)

    def give_back(self, slot: Optional[int], emptied: bool = False) -> None:
        """Mark a slot free (its batch was dropped, or never used it). A slot
        grown past ``slots.RELEASE_ABOVE_BYTES`` (read at each call, so a
        test may set it), or with holes punched in it (``emptied``), gives
        its memory back first (the next batch to use it grows it again, as a
        fresh one would)."""
        if slot is None or self.closed:
            return
        try:
            if emptied or os.fstat(self.fds[slot]).st_size > slots.RELEASE_ABOVE_BYTES:
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

    def _released(self, lease: SlotLease) -> None:
        """(The lease's last leaf is gone, from any thread.) Its slot is free
        again, unless it was retired: then nothing uses its old file any more."""
        if lease.claim():
            if self._leases.get(lease.slot) is lease:
                del self._leases[lease.slot]
            self.give_back(lease.slot, lease.punched)
        else:
            lease.punch_all()
            self._retired.discard(lease)

    def _look(self) -> None:
        """Each slot the user keeps part of, seen so at the last look too (a
        batch whose leaves go one after the other is left alone), gives back
        the pages of its dropped leaves; with no slot free, it is retired
        where it can be, and then one not seen before qualifies too (else
        the next batch would travel through the pipe)."""
        seen, self._seen_partly_kept = self._seen_partly_kept, set()
        for lease in list(self._leases.copy().values()):
            if not lease.partly_kept:
                continue
            if lease not in seen and self._free:
                self._seen_partly_kept.add(lease)
                continue
            if lease.punch():  # (released meanwhile: a free slot with holes)
                if not self.closed:
                    self._empty(lease.slot)
            elif not self._free and self._can_retire and len(self._retired) < RETIRED_MAX:
                self._retire(lease)
            else:
                self._seen_partly_kept.add(lease)

    def _retire(self, lease: SlotLease) -> None:
        """Leave the slot's file to its kept leaves, and make the slot free
        with a fresh file (ungrown: the worker that next fills it grows it)."""
        try:
            fd = shared_memory_file("slot")
        except OSError:
            return  # (no descriptor left: the slot stays out of use until its leaves go)
        lease.retired = True  # (first: a last leaf going from now on finds it among the retired)
        self._retired.add(lease)
        if not lease.claim():  # (its last leaf went meanwhile: given back already)
            self._retired.discard(lease)
            os.close(fd)
            return
        slot = lease.slot
        del self._leases[slot]
        self._maps.pop(slot, None)
        old, self.fds[slot] = self.fds[slot], fd
        self._generation += 1
        self.files[slot] = (self._generation, f"/proc/{os.getpid()}/fd/{fd}")
        os.close(old)  # (the kept leaves' mapping holds the file)
        self._free.append(slot)

    def close(self) -> None:
        """Close every descriptor (the workers are stopped). Mappings that
        batches still use stay valid; they give back the pages of the leaves
        let go, now and as the others go."""
        self.closed = True
        for lease in list(self._leases.copy().values()):
            lease.retired = True  # (no slot is written again: each leaf's pages can go as it goes)
            lease.punch()
        self._leases.clear()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        self._maps.clear()
