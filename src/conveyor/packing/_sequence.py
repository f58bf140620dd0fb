"""One packed sequence, from its pieces: the arrays a model reads.

    pieces (document, start, stop) ──read docs[document][start:stop+1]──▶ tokens, labels, ...

Each piece is one segment. Tokens after the last segment are padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["IGNORE_INDEX", "build_sequence"]

#: The label of a document's last token and of padding: what cross-entropy
#: losses (torch's ``ignore_index``) leave out.
IGNORE_INDEX = -100


def build_sequence(
    pieces: np.ndarray,
    read: Callable[[int], np.ndarray],
    lengths: np.ndarray,
    seq_len: int,
    max_segments: int,
    pad_id: int,
    index: int,
) -> dict[str, Any]:
    """Sequence ``index``'s arrays from its ``pieces`` (rows of document,
    start, stop), reading each document by ``read(document)``."""
    if len(pieces) > max_segments:
        raise ValueError(
            f"Pack: sequence {index} holds {len(pieces)} documents, more than max_segments={max_segments}; "
            f"give a larger max_segments (seq_len, the default, always suffices)"
        )
    tokens = np.full(seq_len, pad_id, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    segment_ids = np.zeros(seq_len, dtype=np.int32)
    positions = np.zeros(seq_len, dtype=np.int64)
    cu_seqlens = np.zeros(max_segments + 1, dtype=np.int32)
    at = 0
    for segment, (doc, start, stop) in enumerate(pieces.tolist(), 1):
        document = read(doc)
        count = stop - start
        tokens[at : at + count] = document[start:stop]
        following = document[start + 1 : min(stop + 1, int(lengths[doc]))]  # (the next token, in the next sequence too)
        labels[at : at + len(following)] = following
        segment_ids[at : at + count] = segment
        positions[at : at + count] = np.arange(start, stop)
        at += count
        cu_seqlens[segment] = at
    cu_seqlens[len(pieces) + 1 :] = at
    return {
        "tokens": tokens,
        "segment_ids": segment_ids,
        "positions": positions,
        "labels": labels,
        "cu_seqlens": cu_seqlens,
        "num_segments": np.int32(len(pieces)),
    }
