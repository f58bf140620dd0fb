"""Placing each sample's arrays in the batch as soon as the sample is made.

    dataset[i] ──▶ RowPlacer.place(sample, k): arrays copied into row k of the
                   batch buffers in the slot, while still in the CPU's cache,
                   and replaced by views of those rows; a leaf with
                   ``fill_into(out)`` (and ``shape``, ``dtype``) writes itself
                   into its row instead (an image decoded there, no copy)
    collate ──▶ _stack_into asks RowPlacer.claim(rows): "these are rows 0..B-1
                of one buffer?" ── yes: the buffer is the output, no second copy

Making all samples first and stacking them after reads every sample back from
main memory once it has left the cache; two workers making 10 MB batches
overflow a shared L3. Collation's rules are untouched: when a sample does not
fit the buffers of sample 0 (another shape or dtype), its arrays stay as they
are and collate takes its usual path (and its usual errors).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional, Sequence

import numpy as np

from ..transport.slots import SlotWriter, StopFlag
from ..transport.tree import map_leaves_at

#: numpy dtype kinds placed in rows (what default_collate stacks as they are).
_ROW_KINDS = "biufc"


class SlotAllocator:
    """The collate :class:`~conveyor.collate.Allocator` of one batch in a
    slot: output arrays come from the slot, nothing is placed ahead."""

    def __init__(self, writer: SlotWriter):
        self._writer = writer

    def __call__(self, shape: tuple, dtype: Any) -> np.ndarray:
        return self._writer.allocate(shape, dtype)

    def place(self, sample: Any, k: int) -> Any:
        return sample

    def claim(self, arrays: Sequence[np.ndarray], dtype: np.dtype) -> Optional[np.ndarray]:
        return None


class RowPlacer(SlotAllocator):
    """A :class:`SlotAllocator` that places each sample's arrays in their
    rows of the batch as the sample is made (``place``) and hands those
    buffers to collate (``claim``). One per task.

    With ``fill_threads`` > 1 (the first batch of an epoch, which the loop
    waits for), leaves that fill themselves are filled after the samples are
    made, shared out over that many threads (their fills release the GIL:
    decoding), before collate sees any row; with 0 (another worker's batch
    meanwhile), by one thread at a lower CPU priority (``_BACKGROUND_NICE``).
    With ``fill_threads`` > 1 and the pool's ``flags``, the first such leaf
    also tells the other workers to hold their first batches until this one
    is done (StopFlag.filling; the worker clears it)."""

    def __init__(self, writer: SlotWriter, batch_size: int, fill_threads: int = 1, flags: Optional[StopFlag] = None):
        super().__init__(writer)
        self._flags = flags if fill_threads > 1 else None
        self._batch_size = batch_size
        self._buffers: dict[tuple, np.ndarray] = {}
        #: id(row view) -> (row view, buffer, row number)
        self._rows: dict[int, tuple] = {}
        self._fill_threads = fill_threads
        #: (leaf, row) whose fill waits for _fill_pending (fill_threads > 1).
        self._pending: list[tuple[Any, np.ndarray]] = []

    def __call__(self, shape: tuple, dtype: Any) -> np.ndarray:
        self._fill_pending()
        return super().__call__(shape, dtype)

    def place(self, sample: Any, k: int) -> Any:
        """``sample`` with its arrays copied into row ``k`` and replaced by the row views."""
        return map_leaves_at(sample, lambda value, path: self._place(value, path, k))

    def _place(self, value: Any, path: tuple, k: int) -> Any:
        if isinstance(value, np.ndarray):
            return self._place_array(value, path, k)
        if getattr(type(value), "fill_into", None) is not None:
            return self._place_filled(value, path, k)
        return value

    def _row_for(self, shape: tuple, dtype: Any, path: tuple, k: int) -> Optional[np.ndarray]:
        """Row ``k`` of the buffer at ``path`` (made by sample 0) when it holds ``shape`` and ``dtype``; else None."""
        buffer = self._buffers.get(path)
        if buffer is None:
            if k != 0:
                return None
            buffer = self._writer.allocate((self._batch_size,) + shape, dtype)
            self._buffers[path] = buffer
        if buffer.shape[1:] != shape or buffer.dtype != dtype:
            return None
        row = buffer[k]
        self._rows[id(row)] = (row, buffer, k)
        return row

    def _place_filled(self, value: Any, path: tuple, k: int) -> Any:
        """A leaf that writes itself (``shape``, ``dtype``, ``fill_into(out)``:
        conveyor.images' PendingImage) made straight in its row; as it is
        when it has no row (collate then decodes it)."""
        shape, dtype = tuple(value.shape), np.dtype(value.dtype)
        if not shape or dtype.kind not in _ROW_KINDS or not dtype.isnative or k >= self._batch_size:
            return value
        row = self._row_for(shape, dtype, path, k)
        if row is None:
            return value
        if self._fill_threads != 1:
            if self._flags is not None:
                self._flags.filling(True)
                self._flags = None
            self._pending.append((value, row))
        else:
            value.fill_into(row)
        return row

    def _fill_pending(self) -> None:
        """Fill the rows put off, over ``fill_threads`` threads (this one
        included; threads made for this batch and joined: it happens once an
        epoch, and leaves nothing running)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        errors: list[BaseException] = []
        if self._fill_threads == 0:
            thread = threading.Thread(
                target=_fill, args=(pending, errors, _BACKGROUND_NICE), name="conveyor-fill-bg", daemon=True
            )
            thread.start()
            thread.join()
            if errors:
                raise errors[0]
            return
        shares = [pending[t :: self._fill_threads] for t in range(self._fill_threads)]
        threads = [
            threading.Thread(target=_fill, args=(share, errors), name=f"conveyor-fill-{t}", daemon=True)
            for t, share in enumerate(shares[1:], 1)
            if share
        ]
        for thread in threads:
            thread.start()
        _fill(shares[0], errors)
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _place_array(self, array: np.ndarray, path: tuple, k: int) -> np.ndarray:
        if array.ndim == 0 or array.dtype.kind not in _ROW_KINDS or not array.dtype.isnative or k >= self._batch_size:
            return array  # (a 0-d row would be a scalar, not a view)
        row = self._row_for(array.shape, array.dtype, path, k)
        if row is None:
            return array
        row[...] = array
        return row

    def claim(self, arrays: Sequence[np.ndarray], dtype: np.dtype) -> Optional[np.ndarray]:
        """The buffer whose rows 0..B-1 are exactly ``arrays``, if its dtype is
        ``dtype`` (collate's result); else None."""
        self._fill_pending()
        first = self._rows.get(id(arrays[0]))
        if first is None or first[0] is not arrays[0]:
            return None
        buffer = first[1]
        if buffer.dtype != dtype or len(arrays) != buffer.shape[0]:
            return None
        for k, array in enumerate(arrays):
            entry = self._rows.get(id(array))
            if entry is None or entry[0] is not array or entry[1] is not buffer or entry[2] != k:
                return None
        return buffer


#: The niceness of a background fill thread (fill_threads=0): under contention
#: it gets about a tenth of a core's share, and it ends with its batch.
_BACKGROUND_NICE = 10


def _fill(share: list, errors: list, nice: int = 0) -> None:
    """Fill each (leaf, row) of ``share`` (this thread first made ``nice``r
    where the system allows it); the first error is kept in ``errors``."""
    if nice and sys.platform.startswith("linux"):  # (elsewhere a thread id is no process id: leave it)
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)  # (Linux: this thread only)
        except (AttributeError, OSError):
            pass
    try:
        for leaf, row in share:
            leaf.fill_into(row)
    except BaseException as exc:  # (re-raised by the thread that collates)
        errors.append(exc)
