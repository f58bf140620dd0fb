"""Where collation puts its output arrays: the allocation protocol.

Every numpy output of a collation is allocated once through an
:class:`Allocator`; collation alone uses :data:`allocate_batch` (fresh arrays),
the engine passes one that points at a shared-memory slot.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import numpy as np


class Allocator(Protocol):
    """Where collation puts its output arrays (the engine's points at shared memory).

    * ``allocator(shape, dtype)``: an uninitialised output array;
    * ``place(sample, k)``: sample ``k`` of the batch, as it is made, with
      its arrays possibly moved into their rows of the output already
      (returns the sample to collate);
    * ``claim(arrays, dtype)``: the output whose rows 0..B-1 already are
      ``arrays``, if the allocator placed them there; else None.
    """

    def __call__(self, shape: tuple, dtype: Any) -> np.ndarray: ...

    def place(self, sample: Any, k: int) -> Any: ...

    def claim(self, arrays: Sequence[np.ndarray], dtype: np.dtype) -> Optional[np.ndarray]: ...


#: Kept for code that names the hook's type as a plain callable.
Allocate = Allocator


class HeapAllocator:
    """The default :class:`Allocator`: fresh arrays, nothing placed ahead."""

    def __call__(self, shape: tuple, dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def place(self, sample: Any, k: int) -> Any:
        return sample

    def claim(self, arrays: Sequence[np.ndarray], dtype: np.dtype) -> Optional[np.ndarray]:
        return None


#: The default allocator (collation without the engine).
allocate_batch = HeapAllocator()


class _FunctionAllocator(HeapAllocator):
    """An :class:`Allocator` around a plain ``allocate(shape, dtype)`` function."""

    def __init__(self, allocate: Any):
        self._allocate = allocate

    def __call__(self, shape: tuple, dtype: Any) -> np.ndarray:
        return self._allocate(shape, dtype)


def as_allocator(allocate: Any) -> Allocator:
    """``allocate`` as an :class:`Allocator`: itself when it is one, else a
    plain ``allocate(shape, dtype)`` function wrapped (nothing placed ahead)."""
    if callable(getattr(allocate, "place", None)) and callable(getattr(allocate, "claim", None)):
        return allocate
    return _FunctionAllocator(allocate)
