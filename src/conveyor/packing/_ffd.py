"""The first-fit-decreasing plan: documents in windows of ``window`` (in the
epoch's order), each window's documents packed into bins of ``seq_len``
tokens, no document split (except one longer than ``seq_len``, if allowed).

    order ──cut──▶ windows of `window` documents
    window w ──lengths──▶ items (longest first) ──first fit──▶ bins ──keyed order──▶ sequences

Each window's bins depend on its documents' lengths alone, so how many bins
every window has is computed from the lengths (no token read), once per
epoch, to know ``len`` and which window holds sequence ``k``; a window's bins
themselves are computed when one of its sequences is first read, and the
last few are kept. First fit finds, for each item, the first bin with room
in O(log window) through a tree of the bins' free room.

A document longer than ``seq_len`` (``too_long="split"``) becomes pieces of
``seq_len`` tokens, each a full bin, and a remainder packed as any other
document.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

__all__ = ["FfdPlan", "first_fit"]

#: Windows whose bins are kept per process: a worker reads sequences of a few
#: windows at a time (consecutive ones, or shuffled ones within the loader's
#: window of prefetch); each holds one row per document.
_WINDOWS_KEPT = 8


def first_fit(sizes: list[int], capacity: int) -> tuple[list[int], int]:
    """The bin of each of ``sizes`` (each at most ``capacity``), the first
    one with room in the order given, and the number of bins used."""
    count = len(sizes)
    width = 1 << max(0, (count - 1).bit_length())
    free = [capacity] * (2 * width)  # a max-tree: leaves are bins (unopened ones are empty), nodes their max
    bins, used = [0] * count, 0
    for i, size in enumerate(sizes):
        node = 1
        while node < width:
            node = 2 * node if free[2 * node] >= size else 2 * node + 1
        leaf = node - width
        bins[i] = leaf
        if leaf >= used:
            used = leaf + 1
        free[node] -= size
        node //= 2
        while node:
            left, right = free[2 * node], free[2 * node + 1]
            free[node] = left if left >= right else right
            node //= 2
    return bins, used


class FfdPlan:
    """Bins of at most ``seq_len`` tokens packed first-fit-decreasing from
    the documents ``order`` (indices into ``lengths``), ``window`` at a time.
    ``bin_order(w, n)`` gives the order of window ``w``'s ``n`` bins (a
    permutation of ``range(n)``)."""

    def __init__(
        self,
        lengths: np.ndarray,
        order: np.ndarray,
        seq_len: int,
        window: int,
        bin_order: Callable[[int, int], np.ndarray],
    ) -> None:
        self.lengths, self.order, self.seq_len, self.window = lengths, order, seq_len, window
        self.bin_order = bin_order
        windows = -(-len(order) // window)
        counts = np.array([self._count(w) for w in range(windows)], dtype=np.int64)
        self.starts = np.zeros(windows + 1, dtype=np.int64)  # the first sequence of each window
        np.cumsum(counts, out=self.starts[1:])
        self.length = int(self.starts[-1])
        self.total_tokens = int(lengths.sum())
        self.tokens_dropped = 0
        self._kept: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {**vars(self), "_kept": {}, "_lock": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        vars(self).update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.length

    def _items(self, w: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Window ``w``'s full pieces of long documents (each a bin) and its
        other items, rows of (document, start, stop), longest first."""
        docs = self.order[w * self.window : (w + 1) * self.window]
        sizes = self.lengths[docs]
        full = sizes // self.seq_len
        rest = sizes - full * self.seq_len
        whole = [
            np.array([[doc, p * self.seq_len, (p + 1) * self.seq_len]], dtype=np.int64)
            for doc, n in zip(docs[full > 0].tolist(), full[full > 0].tolist())
            for p in range(n)
        ]
        has_rest = rest > 0  # (an empty document is in no sequence)
        starts = (full * self.seq_len)[has_rest]
        items = np.stack([docs[has_rest], starts, starts + rest[has_rest]], axis=1)
        by_size = np.argsort(-rest[has_rest], kind="stable")  # (ties in the window's order)
        return whole, items[by_size]

    def _count(self, w: int) -> int:
        whole, items = self._items(w)
        return len(whole) + first_fit((items[:, 2] - items[:, 1]).tolist(), self.seq_len)[1]

    def _bins(self, w: int) -> list[np.ndarray]:
        """Window ``w``'s bins in their sequence order, each rows of pieces."""
        whole, items = self._items(w)
        assigned, used = first_fit((items[:, 2] - items[:, 1]).tolist(), self.seq_len)
        # each bin's items in the order they went in (longest first), by a stable sort on the bin
        by_bin = np.argsort(np.asarray(assigned, dtype=np.int64), kind="stable")
        cuts = np.searchsorted(np.asarray(assigned, dtype=np.int64)[by_bin], np.arange(1, used))
        bins = whole + (np.split(items[by_bin], cuts) if used else [])
        return [bins[b] for b in self.bin_order(w, len(bins)).tolist()]

    def pieces(self, k: int) -> np.ndarray:
        """Sequence ``k``'s pieces: rows of (document, start, stop), in order."""
        w = int(np.searchsorted(self.starts, k, side="right")) - 1
        bins = self._kept.get(w)
        if bins is None:
            bins = self._bins(w)
            with self._lock:
                while len(self._kept) >= _WINDOWS_KEPT:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[w] = bins
        return bins[k - int(self.starts[w])]
