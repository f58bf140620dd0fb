"""``Pack``: a map-style dataset of fixed-length sequences packed from a
map-style dataset of documents.

    Pack(docs, seq_len=2048, method="ffd", seed=0)

    epoch's order = KeyedPermutation(len(docs), key(seed, epoch))  (or 0, 1, ... when shuffle=False)
    pack[k] ──plan (lengths only)──▶ pieces (document, start, stop) ──read docs──▶ tokens, labels, ...

The plan (which tokens of which documents make sequence ``k``) is a pure
function of (seed, epoch, the documents' lengths, the arguments), computed
from the lengths without reading a token (``_concat.py``, ``_ffd.py``): any
number of workers, threads or ranks read the same sequences, and a resume
at any position needs no replay. The loader's state records the packing
(:meth:`Pack.resume_settings`), so a state saved over another packing is
refused, naming what differs.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from ..dataset._protocol import Dataset
from ..rng import derive_seed
from ..sampler.permutation import KeyedPermutation
from ._arguments import METHODS, TOO_LONG, check_docs, check_int, document_lengths, read_document
from ._concat import ConcatPlan
from ._ffd import FfdPlan
from ._sequence import build_sequence

__all__ = ["Pack"]

#: Keys the packing's randomness apart from other users of the same seed.
_ORDER_DOMAIN = zlib.crc32(b"conveyor.Pack order")
_BINS_DOMAIN = zlib.crc32(b"conveyor.Pack bins")


class Pack(Dataset[dict[str, Any]]):
    """Documents packed into sequences of exactly ``seq_len`` tokens.

    Item ``k`` is a dict of numpy arrays:

    - ``tokens`` (int64, ``seq_len``): the token ids; ``pad_id`` on padding.
    - ``segment_ids`` (int32, ``seq_len``): 1, 2, ... for the documents (or
      pieces of them) in the sequence, in order; 0 on padding.
    - ``positions`` (int64, ``seq_len``): each token's position in its
      document (0 at its first token; a piece continued from the previous
      sequence goes on counting); 0 on padding.
    - ``labels`` (int64, ``seq_len``): the next token of the same document
      (the next sequence's first one, for a document cut at the end),
      ``-100`` at each document's last token and on padding.
    - ``cu_seqlens`` (int32, ``max_segments + 1``): the segments'
      boundaries, ``[0, end_1, ..., end_n]`` (``n = num_segments``; ``end_n``
      is the number of real tokens, padding is in no segment), then
      ``end_n`` repeated to the fixed length, so that ``default_collate``
      stacks it; the repeats are empty segments. ``cu_seqlens[:n + 1]`` is
      what a variable-length attention kernel takes for one sequence.
    - ``num_segments`` (an int32 scalar): ``n``.

    Methods:

    - ``"concat"``: the documents one after another, cut every ``seq_len``
      tokens. No padding; a document may continue into the next sequence
      (its positions go on, its segment id there starts at 1). The last
      ``total % seq_len`` tokens are left out (``drop_last=True``, the
      default; ``tokens_dropped`` counts them) or make a last, padded
      sequence. With ``continue_documents=False`` every sequence starts at
      a document's first token instead: the rest of a document cut at a
      sequence's end is dropped (``tokens_dropped`` counts it too).
    - ``"ffd"``: first-fit-decreasing over each window of ``window``
      documents: no document is split and padding is only at a sequence's
      end. A document longer than ``seq_len`` is cut into pieces of
      ``seq_len`` (``too_long="split"``) or refused (``"error"``, at
      construction, naming it). The sequences of a window come in a keyed
      order (with ``shuffle``). ``len`` may change by a few sequences from
      one epoch to the next (each order packs a little differently).

    Arguments:
        docs: a map-style dataset (``len``, ``[]``); item ``i`` is document
            ``i``'s tokens, a 1-D array of ints (or a list of them).
        seq_len: the tokens of a sequence (an int >= 1).
        method: ``"concat"`` or ``"ffd"``.
        seed: roots the documents' order (an int).
        lengths: the documents' lengths (ints, one per document). Without it
            they come from ``docs.lengths`` when the dataset has one (as
            ``conveyor.TokenFiles``), else from reading every document once,
            here. Every document read later is checked against its length.
        shuffle: the documents in a keyed order from ``(seed, epoch)``
            (default), or in their own order.
        drop_last: (concat) leave out the last, partial sequence.
        continue_documents: (concat) a document cut at a sequence's end
            goes on in the next sequence (default), or its rest is dropped.
        window: (ffd) documents packed together (default 1000): a larger
            window fills sequences better; its bins cost more to compute.
        too_long: (ffd) ``"split"`` or ``"error"``.
        max_segments: the length of ``cu_seqlens`` less one; default
            ``seq_len`` (as many documents as a sequence can hold). A
            sequence with more raises an error naming it.
        pad_id: the token id of padding (default 0).
        vocab_size: when given, a token id outside ``[0, vocab_size)`` raises
            an error naming its document.
        epoch: the epoch whose order to pack (see :meth:`set_epoch`).

    Example::

        >>> pack = Pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=4, shuffle=False)
        >>> pack[0]["tokens"].tolist(), pack[0]["segment_ids"].tolist(), pack[0]["labels"].tolist()
        ([1, 2, 3, 4], [1, 1, 1, 2], [2, 3, -100, 5])
    """

    def __init__(
        self,
        docs: Any,
        seq_len: int,
        method: str = "concat",
        *,
        seed: int = 0,
        lengths: Union[Sequence[int], np.ndarray, None] = None,
        shuffle: bool = True,
        drop_last: bool = True,
        continue_documents: bool = True,
        window: int = 1000,
        too_long: str = "split",
        max_segments: Optional[int] = None,
        pad_id: int = 0,
        vocab_size: Optional[int] = None,
        epoch: int = 0,
    ) -> None:
        count = check_docs(docs)
        self.seq_len = check_int("seq_len", seq_len, low=1, hint=" (the tokens of one packed sequence)")
        if method not in METHODS:
            raise ValueError(f"Pack: method must be one of {METHODS}, got {method!r}")
        if too_long not in TOO_LONG:
            raise ValueError(f"Pack: too_long must be one of {TOO_LONG}, got {too_long!r}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("continue_documents", continue_documents)):
            if not isinstance(flag, bool):
                raise TypeError(f"Pack: {name} must be True or False, got {flag!r}")
        if method == "ffd" and not continue_documents:
            raise ValueError(
                "Pack: continue_documents=False is for method='concat'; method='ffd' never cuts a document that "
                "fits, and too_long= says what becomes of a longer one"
            )
        self.continue_documents = continue_documents
        self.docs, self.method, self.shuffle, self.drop_last, self.too_long = docs, method, shuffle, drop_last, too_long
        self.seed = check_int("seed", seed, low=-(1 << 63))
        self.window = check_int("window", window, low=1, hint=" (the documents packed together by method='ffd')")
        self.max_segments = self.seq_len if max_segments is None else check_int("max_segments", max_segments, low=1)
        self.pad_id = check_int("pad_id", pad_id, low=-(1 << 63))
        self.vocab_size = None if vocab_size is None else check_int("vocab_size", vocab_size, low=1)
        self.epoch = check_int("epoch", epoch, low=0)
        #: The documents' lengths (int64), and where they came from: "lengths=", "docs.lengths" or "read".
        self.doc_lengths, self.lengths_source = document_lengths(docs, count, lengths)
        if method == "ffd" and too_long == "error":
            longer = np.flatnonzero(self.doc_lengths > self.seq_len)
            if longer.size:
                first = int(longer[0])
                raise ValueError(
                    f"Pack: document {first} has {int(self.doc_lengths[first])} tokens, more than seq_len="
                    f"{self.seq_len} ({longer.size} documents are longer); give too_long='split' to cut them "
                    f"into pieces of seq_len, or leave them out of docs"
                )
        self._plan: Union[ConcatPlan, FfdPlan, None] = None

    def __getstate__(self) -> dict[str, Any]:
        # Sent to workers with an ffd plan already computed (its windows' sizes cost about 1.5 s per
        # million documents to compute again; its bins are not sent), without a concat plan (its prefix
        # sums, 16 bytes a document, take a few ms per million documents to compute again).
        return {**vars(self), "_plan": self._plan if self.method == "ffd" else None}

    # -- the plan -----------------------------------------------------------

    def _order(self) -> np.ndarray:
        """The documents in this epoch's order."""
        count = len(self.doc_lengths)
        if not self.shuffle:
            return np.arange(count, dtype=np.int64)
        permutation = KeyedPermutation(count, derive_seed(self.seed, _ORDER_DOMAIN, self.epoch))
        return permutation.take(np.arange(count, dtype=np.int64))

    def _bin_order(self, window: int, count: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(count, dtype=np.int64)
        permutation = KeyedPermutation(count, derive_seed(self.seed, _BINS_DOMAIN, self.epoch, window))
        return permutation.take(np.arange(count, dtype=np.int64))

    @property
    def plan(self) -> Union[ConcatPlan, FfdPlan]:
        """This epoch's plan, computed from the lengths on first use."""
        plan = self._plan
        if plan is None:
            order = self._order()
            if self.method == "concat":
                plan = ConcatPlan(self.doc_lengths, order, self.seq_len, self.drop_last, self.continue_documents)
            else:
                plan = FfdPlan(self.doc_lengths, order, self.seq_len, self.window, self._bin_order)
            self._plan = plan
        return plan

    def set_epoch(self, epoch: int) -> None:
        """Pack the documents in ``epoch``'s order from now on (with
        ``shuffle``; the plan is computed again on next use)."""
        self.epoch = check_int("epoch", epoch, low=0)
        self._plan = None

    # -- the dataset --------------------------------------------------------

    def __len__(self) -> int:
        return len(self.plan)

    def pieces(self, index: int) -> np.ndarray:
        """Sequence ``index``'s pieces, rows of (document, start, stop):
        tokens ``start:stop`` of ``docs[document]``, one row per segment."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"Pack: an index is an int, got {type(index).__name__}")
        length = len(self)
        k = int(index) + (length if index < 0 else 0)
        if not 0 <= k < length:
            raise IndexError(f"Pack: index {index} is out of range for {length} sequences")
        return self.plan.pieces(k)

    def __getitem__(self, index: int) -> dict[str, Any]:
        lengths, docs, vocab = self.doc_lengths, self.docs, self.vocab_size
        return build_sequence(
            self.pieces(index),
            lambda doc: read_document(docs, doc, int(lengths[doc]), vocab),
            lengths,
            self.seq_len,
            self.max_segments,
            self.pad_id,
            int(index),
        )

    @property
    def tokens_dropped(self) -> int:
        """The documents' tokens in no sequence this epoch (concat's remainder with ``drop_last``, and
        the rests of cut documents with ``continue_documents=False``)."""
        return self.plan.tokens_dropped

    @property
    def fill_rate(self) -> float:
        """The share of the sequences' tokens that are not padding (1.0 with no sequences)."""
        plan = self.plan
        slots = len(plan) * self.seq_len
        return (plan.total_tokens - plan.tokens_dropped) / slots if slots else 1.0

    def resume_settings(self) -> dict[str, Any]:
        """What a loader's state records of the packing, and checks on load:
        a state saved over other documents' lengths, another method,
        seq_len, seed, epoch or window is refused, naming the keys that differ."""
        return {
            "pack_method": self.method,
            "pack_seq_len": self.seq_len,
            "pack_seed": self.seed,
            "pack_shuffle": self.shuffle,
            "pack_epoch": self.epoch,
            "pack_drop_last": self.drop_last,
            "pack_continue_documents": self.continue_documents,
            "pack_window": self.window,
            "pack_documents": len(self.doc_lengths),
            "pack_lengths_crc32": zlib.crc32(np.ascontiguousarray(self.doc_lengths, dtype="<i8").tobytes()),
        }

    def __repr__(self) -> str:
        extra = f", window={self.window}" if self.method == "ffd" else f", drop_last={self.drop_last}"
        return (
            f"Pack({len(self.doc_lengths)} documents, seq_len={self.seq_len}, method={self.method!r}, "
            f"seed={self.seed}, epoch={self.epoch}{extra})"
        )
