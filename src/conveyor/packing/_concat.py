"""The concatenate-then-split plan: every document one after another (in
the epoch's order), cut into windows of ``seq_len`` tokens.

    order (doc indices) ──lengths──▶ prefix sums ``ends`` (tokens before each document)
    sequence k = tokens [k*seq_len, (k+1)*seq_len) ──binary search in ends──▶ pieces

A piece is ``(document, start, stop)``: tokens ``start:stop`` of one
document. Sequence ``k``'s pieces cost two binary searches, whatever ``k``
is: nothing earlier is built. The prefix sums (8 bytes a document) are
computed once per epoch from the lengths alone.

With ``continue_documents=False`` every sequence starts at a document's
first token: the rest of a document cut at a sequence's end is dropped,
and the next sequence starts with the next document. Where each sequence
starts then depends on the ones before, so the first documents of all the
epoch's sequences are found once per epoch, from the prefix sums alone (one
binary search per sequence, 8 bytes a sequence).
"""

from __future__ import annotations

import bisect

import numpy as np

__all__ = ["ConcatPlan"]


class ConcatPlan:
    """Sequences of ``seq_len`` tokens cut from the documents ``order``
    (indices into ``lengths``) laid end to end. ``drop_last``: the last
    ``total % seq_len`` tokens are left out (no padding anywhere), else they
    make a last, padded sequence."""

    def __init__(
        self, lengths: np.ndarray, order: np.ndarray, seq_len: int, drop_last: bool, continue_documents: bool = True
    ) -> None:
        self.order = order
        self.seq_len = seq_len
        self.ends = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths[order], out=self.ends[1:])
        self.total_tokens = int(self.ends[-1])
        #: Each sequence's first token in the epoch's stream (None: sequence k's is k * seq_len).
        self.first_tokens = None if continue_documents else self._first_tokens(drop_last)
        if self.first_tokens is None:
            full, rest = divmod(self.total_tokens, seq_len)
            self.length = full + (1 if rest and not drop_last else 0)
            kept = min(self.total_tokens, self.length * seq_len)
        else:
            self.length = len(self.first_tokens)
            kept = int(np.minimum(seq_len, self.total_tokens - self.first_tokens).sum())
        #: Tokens of the epoch in no sequence (the remainder that drop_last leaves out, the rests of cut documents).
        self.tokens_dropped = self.total_tokens - kept

    def _first_tokens(self, drop_last: bool) -> np.ndarray:
        """Where each sequence starts when every one starts at a document's first token."""
        ends, total, seq_len = self.ends.tolist(), self.total_tokens, self.seq_len
        firsts, at = [], 0
        while at < total:
            cut = at + seq_len
            if cut > total and drop_last:
                break
            firsts.append(at)
            # the next sequence: the first document that starts at the cut or after it
            following = bisect.bisect_left(ends, cut)
            at = ends[following] if following < len(ends) else total
        return np.asarray(firsts, dtype=np.int64)

    def __len__(self) -> int:
        return self.length

    def pieces(self, k: int) -> np.ndarray:
        """Sequence ``k``'s pieces: rows of (document, start, stop), in order."""
        start = k * self.seq_len if self.first_tokens is None else int(self.first_tokens[k])
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
