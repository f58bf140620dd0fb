"""The concatenate-then-split plan: every document one after another (in
the epoch's order), cut into windows of ``seq_len`` tokens.

    order (doc indices) ──lengths──▶ prefix sums ``ends`` (tokens before each document)
    sequence k = tokens [k*seq_len, (k+1)*seq_len) ──binary search in ends──▶ pieces

A piece is ``(document, start, stop)``: tokens ``start:stop`` of one
document. Sequence ``k``'s pieces cost two binary searches, whatever ``k``
is: nothing earlier is built. The prefix sums (8 bytes a document) are
computed once per epoch from the lengths alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ConcatPlan"]


class ConcatPlan:
    """Sequences of ``seq_len`` tokens cut from the documents ``order``
    (indices into ``lengths``) laid end to end. ``drop_last``: the last
    ``total % seq_len`` tokens are left out (no padding anywhere), else they
    make a last, padded sequence."""

    def __init__(self, lengths: np.ndarray, order: np.ndarray, seq_len: int, drop_last: bool) -> None:
        self.order = order
        self.seq_len = seq_len
        self.ends = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths[order], out=self.ends[1:])
        self.total_tokens = int(self.ends[-1])
        full, rest = divmod(self.total_tokens, seq_len)
        self.length = full + (1 if rest and not drop_last else 0)
        #: Tokens of the epoch in no sequence (the remainder that drop_last leaves out).
        self.tokens_dropped = self.total_tokens - min(self.total_tokens, self.length * seq_len)

    def __len__(self) -> int:
        return self.length

    def pieces(self, k: int) -> np.ndarray:
        """Sequence ``k``'s pieces: rows of (document, start, stop), in order."""
        start = k * self.seq_len
        stop = min(start + self.seq_len, self.total_tokens)
        ends = self.ends
        first = int(np.searchsorted(ends, start, side="right")) - 1
        last = int(np.searchsorted(ends, stop, side="left"))  # (first j with ends[j] >= stop: documents first..last-1)
        at = np.arange(first, last)
        begin = ends[at]
        piece_start = np.maximum(start, begin) - begin
        piece_stop = np.minimum(stop, ends[at + 1]) - begin
        keep = piece_stop > piece_start  # (an empty document is in no sequence)
        return np.stack([self.order[at[keep]], piece_start[keep], piece_stop[keep]], axis=1)
