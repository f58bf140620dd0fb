"""Pack's argument checks and where its documents' lengths come from.

Lengths come from ``lengths=`` when given, else from ``docs.lengths`` when
the dataset has it (``conveyor.TokenFiles`` reads them from its index),
else from reading every document once (``len(docs[i])``), at construction.
Whichever it is, each document read later is checked against its length.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..dataset._protocol import is_iterable_dataset

__all__ = ["METHODS", "TOO_LONG", "check_int", "document_lengths", "check_docs", "read_document"]

#: The packing methods: concatenate-then-split, and first-fit-decreasing within a window.
METHODS = ("concat", "ffd")
#: What ``method="ffd"`` does with a document longer than ``seq_len``.
TOO_LONG = ("split", "error")


def check_int(name: str, value: Any, *, low: int, hint: str = "") -> int:
    """``value`` as an int of at least ``low``, or a TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Pack: {name} must be an int, got {value!r} ({type(value).__name__}){hint}")
    if int(value) < low:
        raise ValueError(f"Pack: {name} must be at least {low}, got {int(value)}{hint}")
    return int(value)


def check_docs(docs: Any) -> int:
    """The number of documents of ``docs``, a map-style dataset (``len`` and ``[]``)."""
    if is_iterable_dataset(docs) or not hasattr(docs, "__getitem__") or not hasattr(docs, "__len__"):
        raise TypeError(
            f"Pack: docs is a {type(docs).__name__}, not a map-style dataset of documents (len and []); "
            f"give Pack a dataset whose item i is document i's tokens (a list or conveyor.TokenFiles does)"
        )
    return len(docs)


def document_lengths(docs: Any, count: int, lengths: Any) -> tuple[np.ndarray, str]:
    """The documents' lengths (int64, one per document) and where they came
    from: ``"lengths="``, ``"docs.lengths"`` or ``"read"``."""
    if lengths is not None:
        source = "lengths="
    elif getattr(docs, "lengths", None) is not None:
        lengths, source = docs.lengths, "docs.lengths"
    else:
        lengths = [len(read_document(docs, i, None)) for i in range(count)]
        source = "read"
    given = np.asarray(lengths)
    if given.ndim != 1 or (given.size and (given.dtype == np.bool_ or given.dtype.kind not in "iu")):
        raise TypeError(
            f"Pack: {source} must be a 1-D sequence of ints (one length per document), got "
            f"{'an array of ' + str(given.dtype) if given.size else type(lengths).__name__} of shape {given.shape}"
        )
    if len(given) != count:
        raise ValueError(
            f"Pack: {source} has {len(given)} lengths but docs has {count} documents; give one length per document"
        )
    values = given.astype(np.int64)
    if values.size and int(values.min()) < 0:
        bad = int(np.flatnonzero(values < 0)[0])
        raise ValueError(f"Pack: {source} gives document {bad} the length {int(values[bad])}; lengths are >= 0")
    return values, source


def read_document(docs: Any, index: int, length: Any, vocab_size: Any = None) -> np.ndarray:
    """Document ``index`` as a 1-D integer array, checked against its
    expected ``length`` (None: not checked) and ``vocab_size`` (None: not checked)."""
    tokens = np.asarray(docs[index])
    if tokens.ndim != 1 or (tokens.size and (tokens.dtype == np.bool_ or tokens.dtype.kind not in "iu")):
        raise TypeError(
            f"Pack: document {index} is not a 1-D array of token ids: got {tokens.dtype} of shape {tokens.shape}"
        )
    if length is not None and len(tokens) != length:
        raise ValueError(
            f"Pack: document {index} has {len(tokens)} tokens, but its length is recorded as {length}; "
            f"the lengths given (lengths= or docs.lengths) do not match the documents"
        )
    if vocab_size is not None and tokens.size:
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"Pack: document {index} holds the token id {bad}, outside [0, vocab_size={vocab_size})")
    return tokens
