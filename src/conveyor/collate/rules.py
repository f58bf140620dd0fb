"""The recursion: default_collate, collate (with a ``collate_fn_map``) and collate_into.

:func:`_collate` looks at ``batch[0]`` at each place in the batch and picks a
rule: a user's function (``collate_fn_map``, then :func:`register_collate`'s
registry), a leaf (:mod:`.leaves`, padded by :mod:`.pad_leaf` inside a pad
scope), or a container, whose columns it collates in turn. The context
(:class:`_Context`, in :mod:`.context`) carries what stays fixed for one
collation: the name used in messages, the ``allocate`` hook, the map and the
padding.
"""

from __future__ import annotations

import collections.abc
import copy
import sys
from typing import Any, Sequence

import numpy as np

from .allocation import Allocate, as_allocator
from .context import _Context
from .errors import (
    _TORCH_SEQUENCE_MESSAGE,
    _TORCH_TYPE_MESSAGE,
    _disagreement,
    _Field,
    _format_key,
    _format_path,
    _note_path,
    _pad_example,
    _positions,
    _sample,
    _type_name,
    _with_padcollate,
)
from .leaves import _collate_arrays, _collate_numbers, _stack_tensors
from .pad_leaf import _child_scope, _is_number_list, _pad_leaf, _PadScope
from .registry import _REGISTRY, CollateFn, CollateFnMap, _mapped_fn, _registered_fn

# --------------------------------------------------------------------------
# Recursing from a registered function
# --------------------------------------------------------------------------


class _Recurse:
    """The ``collate`` callable handed to registered functions."""

    __slots__ = ("_path", "_ctx", "_scope")

    def __init__(self, path: tuple, ctx: _Context, scope: _PadScope | None) -> None:
        self._path = path
        self._ctx = ctx
        self._scope = scope

    def __call__(self, batch: Sequence[Any], key: Any = None) -> Any:
        path = self._path if key is None else self._path + (key,)
        return _collate(batch, path, self._ctx, self._scope)


# --------------------------------------------------------------------------
# The recursion
# --------------------------------------------------------------------------


def _collate(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    if len(batch) == 0:
        raise IndexError(f"{ctx.name}: cannot collate an empty batch at {_format_path(path)}")
    elem = batch[0]
    cls = type(elem)

    if ctx.fn_map is not None:
        fn = _mapped_fn(ctx.fn_map, elem)
        if fn is not None:
            return _call_user_fn(fn, batch, path, ctx, collate_fn_map=ctx.fn_map)
    if _REGISTRY:
        fn = _registered_fn(cls)
        if fn is not None:
            return _call_user_fn(fn, batch, path, ctx, collate=_Recurse(path, ctx, scope))

    if cls is np.ndarray or isinstance(elem, np.ndarray):
        if scope is not None and elem.ndim > 0:
            return _pad_leaf(batch, path, ctx, scope)
        return _collate_arrays(batch, path, ctx)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(elem, torch.Tensor):
        if scope is not None and elem.ndim > 0:
            return _pad_leaf(batch, path, ctx, scope)
        return _stack_tensors(batch, path, ctx, torch)
    if isinstance(elem, (np.bool_, np.number, int, float)):
        return _collate_numbers(batch, path, ctx)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _collate_mapping(batch, path, ctx, scope)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return _collate_namedtuple(batch, path, ctx, scope)
    if isinstance(elem, collections.abc.Sequence):
        if scope is not None and scope.explicit and _is_number_list(elem):
            return _pad_leaf(batch, path, ctx, scope)
        return _collate_sequence(batch, path, ctx, scope)
    raise TypeError(
        _TORCH_TYPE_MESSAGE.format(cls)
        + f". {ctx.name}: cannot collate {_format_path(path)} ({_sample(0)} is {_type_name(elem)}). "
        f"Convert it in the dataset, or teach conveyor with register_collate({cls.__name__}, fn)."
    )


def _call_user_fn(fn: CollateFn, batch: Sequence[Any], path: tuple, ctx: _Context, **kwargs: Any) -> Any:
    try:
        return fn(batch, **kwargs)
    except Exception as error:
        _note_path(error, path, ctx)
        raise


# ---- structures ----------------------------------------------------------


def _require_all(batch: Sequence[Any], kind: type, kind_name: str, path: tuple, ctx: _Context) -> None:
    for i, sample in enumerate(batch):
        if not isinstance(sample, kind):
            raise TypeError(
                f"{ctx.name}: cannot collate {_format_path(path)}: {_sample(0)} is {kind_name} "
                f"({_type_name(batch[0])}) but {_sample(i)} is {_type_name(sample)}; every sample must "
                f"have the same structure."
            )


def _collate_mapping(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    _require_all(batch, collections.abc.Mapping, "a mapping", path, ctx)
    collated = {}
    for key in elem:
        try:
            column = [sample[key] for sample in batch]
        except KeyError:
            missing = [i for i, sample in enumerate(batch) if key not in sample]
            raise KeyError(
                f"{ctx.name}: cannot collate {_format_path(path)}: {_sample(missing[0])} has no key "
                f"{_format_key(key)}, which {_sample(0)} has (samples without it: {_positions(missing)}); "
                f"every sample must have the keys of the first."
            ) from None
        collated[key] = _collate(column, path + (key,), ctx, _child_scope(ctx, scope, key))
    return _rebuild_mapping(elem, collated)


def _collate_namedtuple(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    fields = elem._fields
    return type(elem)(
        *(_collate(column, path + (_Field(fields[i]),), ctx, scope) for i, column in enumerate(zip(*batch)))
    )


def _pad_lists_hint(path: tuple) -> str:
    """How to pad lists of numbers of several lengths instead."""
    example = _pad_example(path, lists=True)
    if example is None:  # PadCollate pads plain lists only under a key it is given
        example = "numpy arrays from __getitem__, then DataLoader(..., collate_fn=PadCollate(0, return_mask=True))"
    return f"pad variable-length sequences {_with_padcollate(example)}"


def _collate_sequence(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    sizes = []
    for i, sample in enumerate(batch):
        try:
            sizes.append(len(sample))
        except TypeError:
            raise TypeError(
                f"{ctx.name}: cannot collate {_format_path(path)}: {_sample(0)} is a sequence "
                f"({_type_name(elem)}) but {_sample(i)} is {_type_name(sample)}, which has no len(); "
                f"every sample must have the same structure."
            ) from None
    if any(size != sizes[0] for size in sizes):
        raise RuntimeError(
            f"{_TORCH_SEQUENCE_MESSAGE}. {ctx.name}: cannot collate {_format_path(path)}: "
            f"{_disagreement(sizes, 'length')}. Sequences are collated position by position, so "
            f"all must have one length; {_pad_lists_hint(path)}."
        )
    # Columns stay the tuples zip makes: torch hands str columns back as they are.
    values = [_collate(column, path + (i,), ctx, scope) for i, column in enumerate(zip(*batch))]
    if isinstance(elem, tuple):
        return values  # torch turns tuples into lists ("backwards compatibility")
    return _rebuild_sequence(elem, values)


def _rebuild_mapping(template: collections.abc.Mapping, values: dict) -> collections.abc.Mapping:
    """A mapping like ``template`` holding ``values``; a dict where that is impossible.

    A mutable mapping is shallow-copied and updated, so subclasses keep their
    extra state (a defaultdict its factory); an immutable one is built from a
    dict. Types that support neither fall back to dict (torch does the same).
    """
    try:
        if isinstance(template, collections.abc.MutableMapping):
            clone = copy.copy(template)
            clone.update(values)
            return clone
        return type(template)(values)  # type: ignore[call-arg]  # (a subclass's constructor takes the items; TypeError falls back)
    except TypeError:
        return values


def _rebuild_sequence(template: Sequence, values: list) -> Sequence:
    """A sequence like ``template`` holding ``values``; a list where that is impossible."""
    try:
        if isinstance(template, collections.abc.MutableSequence):
            clone = copy.copy(template)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(template)(values)  # type: ignore[call-arg]  # (a subclass's constructor takes the items; TypeError falls back)
    except TypeError:
        return values


# --------------------------------------------------------------------------
# Public collate functions
# --------------------------------------------------------------------------


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate a list of samples into a batch of numpy arrays, with torch's rules.

    See :mod:`conveyor.collate` for the rules. Examples::

        >>> default_collate([0, 1, 2])
        array([0, 1, 2])
        >>> default_collate([{"x": np.zeros(2), "name": "a"}, {"x": np.ones(2), "name": "b"}])
        {'x': array([[0., 0.],
               [1., 1.]]), 'name': ['a', 'b']}
        >>> default_collate([(1, 2.0), (3, 4.0)])
        [array([1, 3]), array([2., 4.])]

    Samples holding torch tensors give tensors (``torch.stack``) at those
    places. Types registered with :func:`register_collate` are collated by
    their function.
    """
    return _collate(batch, (), _Context("default_collate"), None)


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """:func:`default_collate` with a torch-style ``collate_fn_map`` consulted first.

    Same signature and lookup as ``torch.utils.data._utils.collate.collate``:
    the exact type of ``batch[0]`` is looked up, then each key in insertion
    order with ``isinstance``; the function found is called as
    ``fn(batch, collate_fn_map=collate_fn_map)``. Unlike torch, the built-in
    rules (and :func:`register_collate`'s registry) still apply to types the
    map does not name, so a map needs only the types it changes.
    """
    return _collate(batch, (), _Context("collate", fn_map=collate_fn_map), None)


def collate_into(batch: Sequence[Any], allocate: Allocate) -> Any:
    """:func:`default_collate`, allocating every numpy output with ``allocate(shape, dtype)``.

    The engine's hook for collating straight into shared memory; ``allocate``
    must return a writable array of exactly that shape and dtype. It may be
    an :class:`~conveyor.collate.Allocator` (which may also place samples
    ahead and claim their rows) or a plain function.
    """
    return _collate(batch, (), _Context("default_collate", allocate=as_allocator(allocate)), None)
