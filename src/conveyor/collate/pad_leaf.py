"""Padding one leaf: the samples at one place, padded along their first axis.

The recursion in :mod:`.rules` calls :func:`_pad_leaf` for array and tensor
leaves inside a :class:`_PadScope`; :func:`_child_scope` opens a scope under
the keys a :class:`~conveyor.collate.PadCollate` names. Numpy samples are
padded into one allocated output, tensors with torch ops on their device.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .dtypes import _BOOL, _INT64, _NUMERIC_KINDS, _UNSUPPORTED_KINDS, _result_dtype, _scalar_dtype
from .errors import (
    _TORCH_STACK_MESSAGE,
    _TORCH_TYPE_MESSAGE,
    _differing,
    _disagreement,
    _format_path,
    _mismatch_error,
    _sample,
)
from .leaves import _holds_tensor

if TYPE_CHECKING:
    from .context import _Context, _Padding


@dataclass(frozen=True)
class _PadScope:
    """Array leaves below this point are padded with ``value``.

    ``explicit`` when a key named in ``PadCollate(keys=...)`` opened the scope:
    then a (nested) list of numbers right under that key counts as an array.
    """

    value: Any
    explicit: bool


def _child_scope(ctx: _Context, scope: _PadScope | None, key: Any) -> _PadScope | None:
    """The pad scope below mapping key ``key``."""
    padding = ctx.padding
    if padding is None or padding.keys is None:
        return scope
    try:
        named = key in padding.keys
    except TypeError:  # unhashable key
        named = False
    if not named:
        return scope
    ctx.pad_keys_seen.add(key)
    value = padding.pad_value[key] if isinstance(padding.pad_value, dict) else padding.pad_value
    return _PadScope(value, explicit=True)


def _is_number_list(x: Any) -> bool:
    """A (nested) list or tuple of numbers, judged by its first element (empty counts)."""
    while isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        if len(x) == 0:
            return True
        x = x[0]
    return _scalar_dtype(x) is not None and not isinstance(x, np.ndarray)


def _padding_of(ctx: _Context) -> _Padding:
    """The PadCollate of a collation that reached a pad scope (only a PadCollate opens one)."""
    assert ctx.padding is not None
    return ctx.padding


def _pad_leaf(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope) -> Any:
    if _holds_tensor(batch):
        return _pad_tensors(batch, path, ctx, scope, sys.modules["torch"])
    arrays = _as_pad_arrays(batch, path, ctx)
    lengths, total = _check_pad_shapes([a.shape for a in arrays], path, ctx)
    dtype = _result_dtype([a.dtype for a in arrays], path, ctx)
    fill = _checked_fill(scope.value, dtype, path, ctx)
    padding = _padding_of(ctx)
    side = padding.side
    values = ctx.allocate((len(arrays), total) + arrays[0].shape[1:], dtype)
    for i, array in enumerate(arrays):
        data, pad = _pad_slices(lengths[i], total, side)
        values[i, data] = array
        values[i, pad] = fill
    lengths_out = mask = None
    if padding.return_lengths:
        lengths_out = ctx.allocate((len(arrays),), _INT64)
        lengths_out[...] = lengths
    if padding.return_mask:
        mask = ctx.allocate((len(arrays), total), _BOOL)
        positions, sample_lengths = np.arange(total), np.asarray(lengths, _INT64)[:, None]
        if side == "right":
            np.less(positions, sample_lengths, out=mask)
        else:
            np.greater_equal(positions, total - sample_lengths, out=mask)
    return padding._result(values, lengths_out, mask)


def _as_pad_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> list[np.ndarray]:
    """The samples as arrays; (nested) lists of numbers are converted, empty ones shaped like the rest."""
    arrays: list[np.ndarray | None] = []
    for i, sample in enumerate(batch):
        if isinstance(sample, (list, tuple)):
            if len(sample) == 0:
                arrays.append(None)  # shaped once the others are known
                continue
            try:
                sample = np.asarray(sample)
            except ValueError:  # ragged nesting
                sample = np.empty(0, object)
            if sample.dtype.kind not in _NUMERIC_KINDS:
                raise TypeError(
                    f"PadCollate: cannot pad {_format_path(path)}: {_sample(i)} is not a (nested) list of "
                    f"numbers of one shape."
                )
        if not isinstance(sample, np.ndarray):
            raise _mismatch_error(batch, i, "an array", path, ctx)
        if sample.dtype.kind in _UNSUPPORTED_KINDS:
            raise TypeError(
                _TORCH_TYPE_MESSAGE.format(sample.dtype)
                + f". PadCollate: cannot pad {_format_path(path)}: {_sample(i)} has dtype {sample.dtype}."
            )
        arrays.append(sample)
    return _shape_empty_lists(arrays)


def _shape_empty_lists(arrays: list[np.ndarray | None]) -> list[np.ndarray]:
    """Give empty lists (None here) the trailing shape and dtype of the other samples.

    To numpy ``[]`` is a float64 array of shape (0,); as one sample among token
    lists it must neither turn the batch into floats nor break a 2-D layout.
    """
    present = [a for a in arrays if a is not None]
    if len(present) == len(arrays):
        return present
    model = present[0] if present else np.zeros(0, _INT64)
    empty = np.zeros((0,) + model.shape[1:], model.dtype)
    return [empty if a is None else a for a in arrays]


def _check_pad_shapes(shapes: Sequence[tuple], path: tuple, ctx: _Context) -> tuple[list[int], int]:
    """The sample lengths and the padded length; samples must agree on every axis but the first."""
    for i, shape in enumerate(shapes):
        if len(shape) == 0:
            raise RuntimeError(
                f"PadCollate: cannot pad {_format_path(path)}: {_sample(i)} is 0-dimensional; padded values "
                f"need a first (sequence) axis.{_keys_hint(ctx)}"
            )
    rests = [shape[1:] for shape in shapes]
    if any(rest != rests[0] for rest in rests):
        j = _differing(rests)[0]
        raise RuntimeError(
            f"{_TORCH_STACK_MESSAGE.format(list(shapes[0]), 0, list(shapes[j]), j)}. "
            f"PadCollate: cannot pad {_format_path(path)}: samples may differ only in their first axis; "
            f"{_disagreement(rests, 'trailing shape')}.{_keys_hint(ctx)}"
        )
    lengths = [shape[0] for shape in shapes]
    return lengths, _padding_of(ctx)._padded_length(max(lengths))


def _keys_hint(ctx: _Context) -> str:
    return " Pass keys=[...] to pad only the values under some keys." if _padding_of(ctx).keys is None else ""


def _pad_slices(length: int, total: int, side: str) -> tuple[slice, slice]:
    """(where the data goes, where the padding goes) along the first axis."""
    if side == "right":
        return slice(0, length), slice(length, total)
    return slice(total - length, total), slice(0, total - length)


def _checked_fill(value: Any, dtype: np.dtype, path: tuple, ctx: _Context) -> np.ndarray:
    """``value`` as a scalar of ``dtype``; ValueError if it does not survive the cast."""
    problem = None
    try:
        with np.errstate(all="ignore"):
            fill = np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as error:
        problem = str(error)
    else:
        if fill.shape != () or not (fill == value or (fill != fill and value != value)):
            problem = f"it becomes {fill!r}"
    if problem is not None:
        raise ValueError(
            f"PadCollate: pad value {value!r} does not fit dtype {dtype} of {_format_path(path)} ({problem}); "
            f"choose a pad value the dtype can hold, or pass a mapping pad_value={{key: value}}."
        )
    return fill


def _pad_tensors(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope, torch: Any) -> Any:
    """Pad a batch holding torch tensors with torch ops (on the tensors' device)."""
    tensors = [s if isinstance(s, torch.Tensor) else torch.as_tensor(s) for s in batch]
    lengths, total = _check_pad_shapes([tuple(t.shape) for t in tensors], path, ctx)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    numpy_dtype = _numpy_dtype_of(dtype, torch)
    if numpy_dtype is not None:
        _checked_fill(scope.value, numpy_dtype, path, ctx)
    padding = _padding_of(ctx)
    side = padding.side
    values = tensors[0].new_empty((len(tensors), total) + tuple(tensors[0].shape[1:]), dtype=dtype)
    for i, tensor in enumerate(tensors):
        data, pad = _pad_slices(lengths[i], total, side)
        values[i, data] = tensor
        values[i, pad] = scope.value
    lengths_out = torch.tensor(lengths, dtype=torch.int64) if padding.return_lengths else None
    mask = None
    if padding.return_mask:
        positions = torch.arange(total, device=values.device)
        sample_lengths = torch.tensor(lengths, dtype=torch.int64, device=values.device)[:, None]
        mask = positions < sample_lengths if side == "right" else positions >= total - sample_lengths
    return padding._result(values, lengths_out, mask)


def _numpy_dtype_of(dtype: Any, torch: Any) -> np.dtype | None:
    """The numpy dtype of a torch dtype, or None where numpy has none (bfloat16, ...)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16 and friends have no numpy dtype
        return None
