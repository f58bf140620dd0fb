"""A batch's leaves into its shared-memory slot (the worker's side of slots.py).

    collate's output ──encode──▶ each array or CPU tensor a :class:`slots.Leaf`
                                 (offset, shape, dtype) in the slot; the rest as it is
                     ──▶ the Batch header (small: it crosses the pipe)

A batch small enough (``slots.INLINE_MAX_BYTES``) travels inline instead:
mapping views and tracking their lifetime would cost more than copying it.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from .slots import INLINE_MAX_BYTES, PLAIN_KINDS, Leaf, SlotWriter
from .tree import map_leaves

#: Carriers for torch dtypes numpy lacks: an integer of the same width.
_SAME_WIDTH_INTS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def _tensor_as_numpy(value: Any) -> tuple[Optional[np.ndarray], Optional[str]]:
    """A numpy view of a plain CPU tensor and, for a dtype numpy lacks, the
    torch dtype to view it back as; (None, None) if it cannot be one."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None, None
    if value.device.type != "cpu" or value.layout != torch.strided or value.requires_grad:
        return None, None
    if value.is_conj() or value.is_neg() or type(value) is not torch.Tensor:
        return None, None
    try:
        return value.numpy(), None
    except (TypeError, RuntimeError):  # bfloat16 and friends have no numpy dtype
        pass
    carrier = _SAME_WIDTH_INTS.get(value.element_size())
    if carrier is None or value.dtype.is_complex:
        return None, None
    try:
        return value.view(getattr(torch, carrier)).numpy(), str(value.dtype).removeprefix("torch.")
    except (TypeError, RuntimeError):
        return None, None


def encode(data: Any, writer: SlotWriter) -> tuple[Any, int]:
    """Replace each array or CPU tensor of ``data`` by a :class:`Leaf` in the
    slot (copying it in unless collate already wrote it there).

    Returns the encoded tree and the bytes used, or ``(data, 0)`` when the
    batch is small enough to travel inline.
    """

    def leaf(value: Any) -> Any:
        is_torch, view = False, None
        array = value if isinstance(value, np.ndarray) else None
        if array is None:
            array, view = _tensor_as_numpy(value)
            is_torch = array is not None
        if array is None or array.dtype.kind not in PLAIN_KINDS or array.dtype.hasobject:
            return value
        offset = writer.offset_of(array)
        if offset is None:
            target = writer.allocate(array.shape, array.dtype.newbyteorder("="))
            offset = writer.offset_of(target)
            if offset is None:  # the slot is full: this one travels inline
                return value
            np.copyto(target, array, casting="unsafe")
        return Leaf(offset, array.shape, array.dtype.newbyteorder("=").str, is_torch, view)

    if writer.used < INLINE_MAX_BYTES and _small(data):
        return data, 0
    encoded = map_leaves(data, leaf)
    return encoded, writer.used


def _small(data: Any) -> bool:
    """Whether every array outside the slot is small too (a custom collate's
    output, which the slot has not seen yet). Stops at the first big one;
    visits a long list of plain values without a call per value."""
    budget = INLINE_MAX_BYTES
    stack = [data]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind in _PLAIN_VALUES:
            continue
        if kind is list or kind is tuple or isinstance(value, (list, tuple)):
            stack.extend(v for v in value if type(v) not in _PLAIN_VALUES)
            continue
        if isinstance(value, dict):
            stack.extend(value.values())
            continue
        try:
            nbytes = value.nbytes
        except Exception:  # none, or none defined (sparse tensors raise)
            continue
        if isinstance(nbytes, int):
            budget -= nbytes
            if budget <= 0:
                return False
    return True


#: Leaves that never hold an array: skipped without a look.
_PLAIN_VALUES = frozenset({int, float, bool, str, bytes, complex, type(None)})
