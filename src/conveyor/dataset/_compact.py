"""CompactList: a read-only list of strings, bytes or numbers kept in a few
numpy buffers, so that forked workers reading it copy no memory.

A dataset holding a Python list of millions of file names or captions
grows in every forked worker as the epoch reads it: reading an item writes
its reference count, on a page shared with the main process, and the kernel
copies that page into the worker (copy-on-access; PyTorch issue 13246). A
CompactList keeps the items in one buffer and makes a fresh Python object
per read, so the shared pages are only ever read::

    >>> names = CompactList(["cat.jpg", "dog.jpg", "émeu.jpg"])
    >>> names[2], len(names), names[-1] == "émeu.jpg"
    ('émeu.jpg', 3, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np

__all__ = ["CompactList"]


class CompactList(Sequence):
    """A read-only sequence of ``str``, ``bytes``, ``int`` or ``float`` (all
    of one kind), stored in numpy arrays: text and bytes as one UTF-8 buffer
    with offsets, numbers as one int64 or float64 array.

    Indexing returns the item (a new object each time), a slice returns a
    CompactList, and it pickles as its arrays (compactly, to spawn workers).
    """

    _kind: str
    _data: np.ndarray
    #: Where each item starts in the UTF-8 buffer (and where the last ends); None for numbers.
    _offsets: Optional[np.ndarray]

    def __init__(self, items: Iterable[Any]):
        items = list(items)
        kinds = {type(item) for item in items}
        if kinds <= {str}:
            self._kind = "str"
        elif kinds <= {bytes}:
            self._kind = "bytes"
        elif kinds <= {int, bool} and bool not in kinds:
            self._kind = "int"
        elif kinds <= {int, float} and bool not in kinds:
            self._kind = "float"
        else:
            names = ", ".join(sorted(kind.__name__ for kind in kinds))
            raise TypeError(
                f"CompactList holds items of one kind (str, bytes, int or float), got {names}; "
                f"keep other items in a plain list, or convert them first"
            )
        if self._kind in ("str", "bytes"):
            encoded = [item.encode("utf-8") if self._kind == "str" else item for item in items]
            lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
            self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
            np.cumsum(lengths, out=self._offsets[1:])
            self._data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        else:
            self._offsets = None
            self._data = np.asarray(items, dtype=np.int64 if self._kind == "int" else np.float64)

    @classmethod
    def _of(cls, kind: str, data: np.ndarray, offsets: Optional[np.ndarray]) -> "CompactList":
        new = cls.__new__(cls)
        new._kind, new._data, new._offsets = kind, data, offsets
        return new

    def __len__(self) -> int:
        return len(self._data) if self._offsets is None else len(self._offsets) - 1

    def __getitem__(self, index: Union[int, slice]) -> Any:
        if isinstance(index, slice):
            positions = range(len(self))[index]
            if self._offsets is None:
                return self._of(self._kind, self._data[index].copy(), None)
            return CompactList(self[i] for i in positions)
        i = int(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"CompactList index {index} out of range for {len(self)} items")
        if self._offsets is None:
            return self._data[i].item()
        raw = self._data[self._offsets[i] : self._offsets[i + 1]].tobytes()
        return raw.decode("utf-8") if self._kind == "str" else raw

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, (CompactList, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        shown = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        more = ", ..." if len(self) > 3 else ""
        return f"CompactList([{shown}{more}], {len(self)} {self._kind} items)"

    @property
    def nbytes(self) -> int:
        """Bytes the items take (the buffers)."""
        return self._data.nbytes + (self._offsets.nbytes if self._offsets is not None else 0)
