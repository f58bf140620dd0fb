"""What a delivered batch's leaves hold of their slot (the main side of slots.py).

    SlotPool.decode ──▶ each Leaf: small (≤ OWN_COPY_MAX_BYTES) ──copied out──▶ an array of its own
                                   large ──▶ a view on the slot, on a base array of its own (SlotLease.view)
    each large leaf let go ──▶ SlotLease: the last one ──▶ SlotPool.give_back(slot)
    no free slot left, or the pool closing ──▶ SlotLease.punch: pages no live leaf touches go back

A leaf owns its lifetime: what a user keeps of a batch keeps only its own
bytes alive, never the whole slot. A small leaf (a label, a length, a box)
is copied out of the slot as it is delivered, a memcpy of at most a few
microseconds, so that ``targets.append(y)`` keeps 512 bytes, not the batch's
images, and its slot goes back to the pool once the large leaves are let
go. A large leaf stays a zero-copy view; its slot is not reused while it
lives (a slot in use is never written). Once some of a batch's large leaves
are let go and others kept (the masks of every batch, kept next to images
let go), the pages that no kept leaf touches are given back to the system
(``madvise(MADV_REMOVE)``, a hole in the slot's file) when the pool runs out
of free slots, or when its workers stop; until then such a slot holds no more
than a free slot holds anyway. A kept large leaf then holds its own pages
(plus at most the two pages it shares with its neighbours), and its slot
stays out of use until it is let go: once every slot is kept, the next
batches travel pickled through the pipe (slower, never overwritten).
A slot with holes is emptied when its last leaf goes, so the worker that
next fills it grows it afresh (with ``posix_fallocate``: a full memory fails
there with an error, not with a Bus error on a page of a hole).

Why not at once: in a loop, ``for x, y in loader`` drops ``x`` a moment before
``y``; giving its pages back then would make every batch allocate its slot
anew. Where the system has no ``MADV_REMOVE`` (macOS), a slot partly kept
keeps its memory until its last leaf goes.
"""

from __future__ import annotations

import itertools
import mmap
import weakref
from typing import Any, Callable, Optional

import numpy as np

#: Leaves up to this size are copied out of the slot at delivery: a few
#: microseconds of memcpy, against keeping the whole slot alive for as long
#: as the user keeps the leaf (labels, lengths and boxes are far smaller).
OWN_COPY_MAX_BYTES = 64 << 10
#: ``madvise`` advice that frees a shared mapping's pages (a hole in the file); None where there is none.
_MADV_REMOVE: Optional[int] = getattr(mmap, "MADV_REMOVE", None)


def own_copy(mapping: Any, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes at ``offset`` of the slot, copied into memory of their own."""
    return np.frombuffer(mapping, np.uint8, count=nbytes, offset=offset).copy()


class SlotLease:
    """Which large leaves of one delivered batch still live in slot ``slot``.

    Ownership rule: the lease is made by ``SlotPool.decode`` and holds the
    slot for the main process from delivery until its last large leaf is
    gone (then ``release(slot, emptied)`` gives it back, ``emptied`` when
    holes were punched in it). Each large leaf is a view on a base array of
    its own, whose finalizer counts it gone; decode holds one count of its own
    until every leaf is made, so a leaf dropped while decoding does not free
    the slot early. Finalizers run in whatever thread drops the last
    reference, so the counting takes no lock (``next`` on an
    ``itertools.count`` is atomic). Only the thread that lends slots calls
    ``punch`` (or the pool's ``close``, once its workers are stopped): a slot
    it punches cannot be lent meanwhile.
    """

    def __init__(self, slot: int, mapping: Any, release: Callable[[int, bool], None]):
        self.slot = slot
        self._mapping = mapping
        self._release = release
        self._spans: list[tuple[int, int]] = []  # (start, end) in the slot of each large leaf
        self._alive: list[bool] = []
        self._holds = 1  # the leaves made so far, and decode's own hold
        self._gone = itertools.count(1)
        self._dead_when_punched = 0
        self.punched = False
        self.released = False

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        """A large leaf's bytes: a view on the slot whose lifetime this lease follows."""
        base = np.frombuffer(self._mapping, np.uint8, count=nbytes, offset=offset)
        index = len(self._spans)
        self._spans.append((offset, offset + nbytes))
        self._alive.append(True)
        self._holds += 1
        weakref.finalize(base, self._leaf_gone, index)
        return base

    def decoded(self) -> None:
        """Every leaf is made: decode lets go of its own hold."""
        self._count_gone()

    def _leaf_gone(self, index: int) -> None:
        self._alive[index] = False
        self._count_gone()

    def _count_gone(self) -> None:
        if next(self._gone) == self._holds:  # (exactly one caller sees the last)
            self.released = True
            self._release(self.slot, self.punched)

    @property
    def partly_kept(self) -> bool:
        """Some large leaves were let go and others are still held."""
        return not self.released and 0 < self._alive.count(False) < len(self._alive)

    def punch(self) -> bool:
        """Give the system back the pages of the slot that no live leaf
        touches, when leaves were let go since the last time; whether the
        slot was released meanwhile (its caller then empties it: a free slot
        with holes would make its next writer fault in pages one by one)."""
        dead = self._alive.count(False)
        if _MADV_REMOVE is None or dead == self._dead_when_punched or not self.partly_kept:
            return False
        self._dead_when_punched = dead
        self.punched = True
        page = mmap.PAGESIZE
        live = sorted(span for span, alive in zip(self._spans, self._alive) if alive)
        start = 0
        for low, high in live + [(len(self._mapping), len(self._mapping))]:
            end = low // page * page
            if end > start:
                try:
                    self._mapping.madvise(_MADV_REMOVE, start, end - start)
                except OSError:  # (the slot was emptied meanwhile: nothing left to give back)
                    break
            start = max(start, (high + page - 1) // page * page)
        return self.released
