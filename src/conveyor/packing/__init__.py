"""Packing token documents into fixed-length sequences: :class:`Pack`
(``conveyor.Pack``). See docs/text.md, "Packing documents into sequences".

    _arguments.py  argument checks; where the documents' lengths come from
    _concat.py     the concatenate-then-split plan (prefix sums, binary search)
    _ffd.py        the first-fit-decreasing plan (windows of documents, bins)
    _sequence.py   one sequence's arrays from its pieces
    _dataset.py    Pack, the map-style dataset over a plan
"""

from ._dataset import Pack
from ._sequence import IGNORE_INDEX

__all__ = ["Pack", "IGNORE_INDEX"]
