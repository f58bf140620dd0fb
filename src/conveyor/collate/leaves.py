"""Collating one place in the batch that holds leaves: arrays, numbers, tensors.

Each function here receives the B samples at one place and returns one
array of shape ``(B, ...)`` (or, for tensors, ``torch.stack``'s tensor). Every
numpy output is allocated once through the context's ``allocate`` hook, which
the engine points at shared memory.
"""

from __future__ import annotations

import collections.abc
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .allocation import Allocator, allocate_batch
from .dtypes import _FLOAT64, _UNSUPPORTED_KINDS, _result_dtype, _scalar_dtype
from .errors import (
    _TORCH_STACK_MESSAGE,
    _TORCH_TYPE_MESSAGE,
    _differing,
    _disagreement,
    _format_path,
    _mismatch_error,
    _pad_example,
    _sample,
    _type_name,
    _with_padcollate,
)

if TYPE_CHECKING:
    from .context import _Context


def _stack_into(arrays: Sequence[np.ndarray], dtype: np.dtype, allocate: Allocator) -> np.ndarray:
    """Allocate ``(len(arrays), *arrays[0].shape)`` once and copy each sample
    in, unless the allocator placed the samples in their rows already
    (``claim``: then its output is the result)."""
    out = allocate.claim(arrays, dtype)
    if out is not None:
        return out
    out = allocate((len(arrays),) + arrays[0].shape, dtype)
    for i, array in enumerate(arrays):
        out[i] = array
    return out


def _holds_tensor(batch: Sequence[Any]) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and any(isinstance(sample, torch.Tensor) for sample in batch)


# ---- numpy arrays ----------------------------------------------------------


def _collate_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> Any:
    if _holds_tensor(batch):  # as torch: convert every sample to a tensor, then stack
        torch = sys.modules["torch"]
        return _stack_tensors([torch.as_tensor(sample) for sample in batch], path, ctx, torch)
    arrays = _as_arrays(batch, path, ctx)
    shapes = [array.shape for array in arrays]
    if any(shape != shapes[0] for shape in shapes):
        raise RuntimeError(_unequal_shapes_message(shapes, path, ctx))
    return _stack_into(arrays, _result_dtype([a.dtype for a in arrays], path, ctx), ctx.allocate)


def _as_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> list[np.ndarray]:
    """The samples of an array-led batch as numpy arrays of supported dtypes.

    Numbers and numpy scalars among them become 0-d arrays of torch's dtype.
    """
    arrays = []
    for i, sample in enumerate(batch):
        if not isinstance(sample, np.ndarray):
            dtype = _scalar_dtype(sample)
            if dtype is None:
                raise _mismatch_error(batch, i, "an array", path, ctx)
            sample = np.asarray(sample, dtype)
        elif sample.dtype.kind in _UNSUPPORTED_KINDS:
            raise TypeError(
                _TORCH_TYPE_MESSAGE.format(sample.dtype)
                + f". {ctx.name}: cannot collate {_format_path(path)}: {_sample(i)} is an array of dtype "
                f"{sample.dtype}; string and object arrays cannot be batched. Keep them as str/bytes "
                f"(collated into a list) or encode them as numbers."
            )
        arrays.append(sample)
    return arrays


def _unequal_shapes_message(shapes: Sequence[tuple], path: tuple, ctx: _Context) -> str:
    j = _differing(shapes)[0]
    torch_text = _TORCH_STACK_MESSAGE.format(list(shapes[0]), 0, list(shapes[j]), j)
    hint = "Resize or crop them to one size"
    if len(shapes[0]) > 0 and len({s[1:] for s in shapes}) == 1 and len({len(s) for s in shapes}) == 1:
        hint += f", or pad them along their first axis {_with_padcollate(_pad_example(path))}"
    return f"{torch_text}. {ctx.name}: cannot stack {_format_path(path)}: {_disagreement(shapes, 'shape')}. {hint}."


# ---- numbers ---------------------------------------------------------------


def _collate_numbers(batch: Sequence[Any], path: tuple, ctx: _Context) -> Any:
    """Python numbers and numpy scalars -> a (B,) array with torch's dtype.

    torch builds a float-led batch with ``dtype=float64`` and infers the dtype
    of every other batch from all its elements (``torch.tensor(batch)``).
    """
    float_led = isinstance(batch[0], float) and not isinstance(batch[0], np.generic)
    dtypes = []
    for i, sample in enumerate(batch):
        dtype = _scalar_dtype(sample)
        if dtype is None or (float_led and isinstance(sample, complex)):
            if _holds_tensor(batch):  # 0-d tensors among numbers: torch's own result
                torch = sys.modules["torch"]
                return torch.tensor(batch, dtype=torch.float64) if float_led else torch.as_tensor(batch)
            raise _number_mismatch_error(batch, i, float_led, path, ctx)
        dtypes.append(dtype)
    dtype = _FLOAT64 if float_led else _result_dtype(dtypes, path, ctx)
    try:
        values = np.array(batch, dtype=dtype)
    except OverflowError:
        i = next((i for i, x in enumerate(batch) if isinstance(x, int) and not -(2**63) <= x < 2**63), 0)
        raise ValueError(
            f"Overflow when unpacking long long. {ctx.name}: cannot collate {_format_path(path)}: {_sample(i)} "
            f"holds {batch[i]}, which does not fit in int64."
        ) from None
    if ctx.allocate is allocate_batch:
        return values
    out = ctx.allocate(values.shape, dtype)
    out[...] = values
    return out


def _number_mismatch_error(batch: Sequence[Any], i: int, float_led: bool, path: tuple, ctx: _Context) -> Exception:
    """The exception torch raises for a non-number in a number batch, with context."""
    sample = batch[i]
    name = _type_name(sample)
    error_type: type[Exception]
    if float_led:
        error_type, torch_text = TypeError, f"must be real number, not {name}"
    elif isinstance(sample, (str, bytes)):
        error_type, torch_text = TypeError, f"new(): invalid data type '{name}'"
    elif isinstance(sample, (collections.abc.Sequence, np.ndarray, np.generic)):
        error_type, torch_text = TypeError, f"'{name}' object cannot be interpreted as an integer"
    else:
        error_type, torch_text = RuntimeError, f"Could not infer dtype of {name}"
    return error_type(
        f"{torch_text}. {ctx.name}: cannot collate {_format_path(path)}: {_sample(0)} is "
        f"{_type_name(batch[0])} but {_sample(i)} is {name}; every sample must hold a number here."
    )


# ---- torch tensors ----------------------------------------------------------

_TORCH_NESTED_MESSAGE = (
    "Batches of nested tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)
_TORCH_SPARSE_MESSAGE = (
    "Batches of sparse tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)


def _stack_tensors(batch: Sequence[Any], path: tuple, ctx: _Context, torch: Any) -> Any:
    """``torch.stack(batch)``, as torch collates tensors, with errors that say where."""
    elem = batch[0]
    where = f"{ctx.name}: cannot stack {_format_path(path)}"
    if elem.is_nested:
        raise RuntimeError(f"{_TORCH_NESTED_MESSAGE} {where}.")
    if elem.layout in _sparse_layouts(torch):
        raise RuntimeError(f"{_TORCH_SPARSE_MESSAGE} {where}.")
    for i, sample in enumerate(batch):
        if not isinstance(sample, torch.Tensor):
            raise TypeError(
                f"expected Tensor as element {i} in argument 0, but got {_type_name(sample)}. {where}: "
                f"{_sample(0)} is a torch.Tensor but {_sample(i)} is {_type_name(sample)}."
            )
    shapes = [tuple(t.shape) for t in batch]
    if any(shape != shapes[0] for shape in shapes):
        raise RuntimeError(_unequal_shapes_message(shapes, path, ctx))
    try:
        return torch.stack(batch, 0)
    except (RuntimeError, TypeError, ValueError) as error:
        base = next(t for t in (RuntimeError, TypeError, ValueError) if isinstance(error, t))
        raise base(f"{error}. {where}.") from error


def _sparse_layouts(torch: Any) -> tuple:
    return (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
