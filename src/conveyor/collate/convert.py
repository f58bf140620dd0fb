"""Conversion without batching: default_convert, to_torch, and the torch_* pair.

One walk, :func:`_convert`, rebuilds a sample's or batch's containers and maps
its numpy leaves: unchanged (:func:`default_convert`) or to tensors sharing
their memory (:func:`to_torch`, :func:`torch_default_convert`).
:func:`torch_default_collate` is :func:`to_torch` after ``default_collate``.
torch is imported only when one of the torch functions is called.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .dtypes import _UNSUPPORTED_KINDS
from .rules import _rebuild_mapping, _rebuild_sequence, default_collate


def _convert(data: Any, leaf: Callable[[Any], Any], tuples_to_lists: bool) -> Any:
    """Rebuild ``data``'s containers as torch's default_convert does, mapping numpy leaves with ``leaf``."""
    if isinstance(data, (np.ndarray, np.generic)):
        return data if isinstance(data, (str, bytes)) else leaf(data)  # np.str_ / np.bytes_ stay
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, {key: _convert(data[key], leaf, tuples_to_lists) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_convert(d, leaf, tuples_to_lists) for d in data))
    if isinstance(data, tuple):
        values = [_convert(d, leaf, tuples_to_lists) for d in data]
        if tuples_to_lists:
            return values  # torch's "backwards compatibility"
        return tuple(values) if type(data) is tuple else _rebuild_sequence(data, values)
    if isinstance(data, collections.abc.Sequence):
        return _rebuild_sequence(data, [_convert(d, leaf, tuples_to_lists) for d in data])
    return data


def default_convert(data: Any) -> Any:
    """torch's ``default_convert`` for the core: rebuild containers, keep numpy leaves.

    The structure rules are torch's (tuples become lists, namedtuples and
    mappings keep their type); arrays stay numpy arrays since the core has
    nothing to convert them to. :func:`torch_default_convert` makes tensors.

        >>> default_convert((np.zeros(2), "a"))
        [array([0., 0.]), 'a']
    """
    return _convert(data, _identity, tuples_to_lists=True)


def _identity(x: Any) -> Any:
    return x


def array_to_tensor(x: Any, torch_dtype: Optional[str] = None) -> Any:
    """A numpy leaf as a tensor: the one place conveyor turns numpy into torch.

    Arrays share their memory (``torch.from_numpy``); string and object
    arrays stay as they are; numpy scalars go through ``torch.as_tensor``.
    ``torch_dtype`` names a torch dtype numpy lacks (``"bfloat16"``): the
    array holds its bytes as integers of the same width, viewed back here.
    """
    import torch

    if isinstance(x, np.ndarray):
        if x.dtype.kind in _UNSUPPORTED_KINDS:
            return x
        tensor = torch.from_numpy(x)
        return tensor if torch_dtype is None else tensor.view(getattr(torch, torch_dtype))
    return torch.as_tensor(x)


def _numpy_module_leaf_to_tensor(x: Any) -> Any:
    # torch converts only types defined by numpy itself (not ndarray subclasses from elsewhere).
    return array_to_tensor(x) if type(x).__module__ == "numpy" else x


def torch_default_convert(data: Any) -> Any:
    """``torch.utils.data.default_convert``: numpy leaves become tensors, tuples become lists."""
    return _convert(data, _numpy_module_leaf_to_tensor, tuples_to_lists=True)


def to_torch(tree: Any) -> Any:
    """Turn the numpy leaves of a collated batch into torch tensors, zero-copy.

    Arrays go through ``torch.from_numpy`` (the tensor shares the array's
    memory), numpy scalars through ``torch.as_tensor``; string and object
    arrays, Python numbers, strings, tensors and unknown objects stay as they
    are. Containers keep their exact types (a tuple stays a tuple), so
    ``to_torch(default_collate(b))`` equals torch's ``default_collate(b)``.
    """
    return _convert(tree, array_to_tensor, tuples_to_lists=False)


def torch_default_collate(batch: Sequence[Any]) -> Any:
    """``torch.utils.data.default_collate``: the same values, dtypes, shapes and containers.

    Computed as ``to_torch(default_collate(batch))``, so the numpy half can run
    anywhere and the tensors share its memory.
    """
    return to_torch(default_collate(batch))
