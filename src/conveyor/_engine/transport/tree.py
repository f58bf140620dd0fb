"""Mapping the leaves of a batch: the one walk the engine uses over batches
and samples (encoding into slots, decoding views, pinning, placing a
sample's arrays in their batch rows).

dicts (subclasses too, when they copy), lists, tuples and namedtuples are
rebuilt with the same type; anything else is a leaf.
"""

from __future__ import annotations

import copy
from typing import Any, Callable


def _rebuild(template: Any, values: Any) -> Any:
    """A container like ``template`` holding ``values`` (a dict or a list);
    None when its type cannot be rebuilt that way (it is then a leaf)."""
    if type(template) is dict:
        return values  # already a new dict
    if type(template) in (list, tuple):
        return type(template)(values)
    try:
        if isinstance(template, dict):
            clone = copy.copy(template)
            clone.clear()
            clone.update(values)
            return clone
        if hasattr(template, "_fields"):
            return type(template)(*values)
        return type(template)(values)
    except Exception:  # a subclass with another constructor
        return None


def map_leaves(data: Any, leaf: Callable[[Any], Any]) -> Any:
    """Apply ``leaf`` to every non-container of ``data``, rebuilding dicts,
    lists, tuples and namedtuples; other containers are leaves."""
    return _walk(data, lambda value, path: leaf(value), ())


def map_leaves_at(data: Any, leaf: Callable[[Any, tuple], Any]) -> Any:
    """:func:`map_leaves` with each leaf's path (its keys and indices from
    the top, e.g. ``("image", 0)``) given to ``leaf(value, path)``."""
    return _walk(data, leaf, ())


def _walk(data: Any, leaf: Callable[[Any, tuple], Any], path: tuple) -> Any:
    if isinstance(data, dict):
        rebuilt = _rebuild(data, {k: _walk(v, leaf, path + (k,)) for k, v in data.items()})
        if rebuilt is not None:
            return rebuilt
    elif isinstance(data, (list, tuple)):
        rebuilt = _rebuild(data, [_walk(v, leaf, path + (i,)) for i, v in enumerate(data)])
        if rebuilt is not None:
            return rebuilt
    return leaf(data, path)
