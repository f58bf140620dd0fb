"""What a delivered batch's leaves hold of their slot (the main side of slots.py).

    SlotPool.decode ──▶ each Leaf: small (≤ OWN_COPY_MAX_BYTES) ──copied out──▶ an array of its own
                                   large ──▶ a view on the slot, on a base array of its own (SlotLease.view)
    each large leaf let go ──▶ SlotLease: the last one ──▶ SlotPool.give_back(slot)
    a slot seen partly kept at two lends ──▶ SlotLease.punch: pages no live leaf touches go back;
                                             with no slot free, the pool retires it (slot_pool.py)

A leaf owns its lifetime: what a user keeps of a batch keeps only its own
bytes alive, never the whole slot.

* A small leaf (a label, a length, a box) is copied out of the slot as it is
  delivered, a memcpy of at most a few microseconds, so that
  ``targets.append(y)`` keeps 512 bytes, not the batch's images, and the
  slot goes back to the pool once the large leaves are let go.
* A large leaf stays a zero-copy view; its slot is not written while it
  lives. Once some large leaves of a batch are let go and others kept (the
  masks of every batch, kept beside images let go), the pages that no kept
  leaf touches go back to the system (``madvise(MADV_REMOVE)``: a hole in
  the slot's file), and when the pool needs the slot, its file is left to
  the kept leaves and the slot gets a fresh one. A kept large leaf then
  holds its own pages, plus at most the two it shares with its neighbours.
  A slot with holes is emptied when its last leaf goes, so the worker that
  next fills it grows it afresh (with ``posix_fallocate``: a full memory
  fails there with an error, not with a Bus error on a page of a hole).

Why not at the first leaf let go: ``for x, y in loader`` drops ``x`` a moment
before ``y``; giving its pages back then would make every batch allocate its
slot anew. A slot is punched once it is still partly kept at the next lend
of a slot, so what waits is a few batches at most. Where the system has no
``MADV_REMOVE`` (macOS), a partly kept slot keeps its memory until its last
leaf goes.
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

    Ownership rule: ``SlotPool.decode`` makes the lease, which holds the
    slot for the main process from delivery until its last large leaf is
    gone; ``release(lease)`` then tells the pool. The pool may retire the
    slot before that (``claim``, then ``retired``): the file the leaves lie
    in is then theirs alone, and goes when the last of them goes. Each large
    leaf is a view on a base array of its own, whose finalizer counts it
    gone; decode holds one count of its own until every leaf is made, so a
    leaf dropped while decoding does not free the slot early. Finalizers run
    in whatever thread drops the last reference, so nothing here takes a
    lock: ``next`` on an ``itertools.count`` and ``list.pop`` are atomic,
    and exactly one of the pool's release and retirement claims the slot.
    Only the thread that lends slots calls ``punch`` on a lease not retired
    (or the pool's ``close``, once its workers are stopped), so a slot it
    punches is not lent meanwhile.
    """

    def __init__(self, slot: int, mapping: Any, release: Callable[["SlotLease"], None]):
        self.slot = slot
        self._mapping = mapping
        self._release = release
        self._spans: list[tuple[int, int]] = []  # (start, end) in the slot of each large leaf
        self._alive: list[bool] = []
        self._holds = 1  # the leaves made so far, and decode's own hold
        self._gone = itertools.count(1)
        self._claim = [True]
        self._dead_when_punched = 0
        self.punched = False
        self.released = False
        self.retired = False

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

    def claim(self) -> bool:
        """Whether the caller is the one to dispose of the slot (true once only)."""
        try:
            return self._claim.pop()
        except IndexError:
            return False

    def _leaf_gone(self, index: int) -> None:
        self._alive[index] = False
        if not self._count_gone() and self.retired:
            self.punch()  # (a retired file, or a closed pool's, is never written again: its pages can go at once)

    def _count_gone(self) -> bool:
        """Count one hold gone; whether it was the last."""
        if next(self._gone) != self._holds:  # (exactly one caller sees the last)
            return False
        self.released = True
        self._release(self)
        return True

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
        self._give_back_pages(sorted(span for span, alive in zip(self._spans, self._alive) if alive))
        return self.released

    def punch_all(self) -> None:
        """(A retired file, its last leaf gone) give back every page: the
        workers may still hold the file open until they next write the slot."""
        self._give_back_pages([])

    def _give_back_pages(self, live: list[tuple[int, int]]) -> None:
        """``madvise(MADV_REMOVE)`` every page of the mapping outside the ``live`` spans (sorted)."""
        if _MADV_REMOVE is None:
            return
        page = mmap.PAGESIZE
        size = len(self._mapping)
        start = 0
        for low, high in live + [(size, size)]:
            end = low // page * page
            if end > start:
                try:
                    self._mapping.madvise(_MADV_REMOVE, start, end - start)
                except (OSError, ValueError):  # (emptied, or closed, meanwhile: nothing left to give back)
                    return
            start = max(start, (high + page - 1) // page * page)
