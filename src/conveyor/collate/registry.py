"""The type registry: :func:`register_collate`, and torch's ``collate_fn_map`` lookup.

Both answer one question for the recursion in :mod:`.rules`: is there a
user's function for the type of ``batch[0]``?
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Optional, TypeVar, overload

from .errors import _type_name

CollateFn = Callable[..., Any]
CollateFnMap = collections.abc.Mapping  # {type or tuple of types: fn(batch, *, collate_fn_map)}

_REGISTRY: dict[type, CollateFn] = {}


_Fn = TypeVar("_Fn", bound=CollateFn)


@overload
def register_collate(types: type | tuple[type, ...], fn: None = None) -> Callable[[_Fn], _Fn]: ...


@overload
def register_collate(types: type | tuple[type, ...], fn: CollateFn) -> None: ...


def register_collate(types: type | tuple[type, ...], fn: CollateFn | None = None) -> Optional[Callable[[_Fn], _Fn]]:
    """Teach :func:`default_collate` (and every collate in this package) a type.

    ``fn(batch, *, collate)`` receives the samples at one place in the batch
    whose first element is an instance of ``types``, and returns the collated
    value. ``collate(sub_batch, key=None)`` collates a list of sub-values with
    the caller's rules (registry, padding, numpy or torch); ``key`` names the
    step for error messages. Lookup walks ``type(batch[0]).__mro__``, so the
    most specific registration wins; registrations take precedence over the
    built-in rules. Usable as a decorator::

        >>> import numpy as np
        >>> from conveyor.collate import default_collate
        >>> class Box:
        ...     def __init__(self, xyxy):
        ...         self.xyxy = xyxy
        >>> @register_collate(Box)
        ... def collate_boxes(batch, *, collate):
        ...     return collate([b.xyxy for b in batch], key="xyxy")
        >>> default_collate([Box(np.zeros(4)), Box(np.ones(4))]).shape
        (2, 4)
        >>> unregister_collate(Box)

    The registry is per process: a worker started with ``fork`` inherits it,
    one started with ``spawn`` or ``forkserver`` sees only registrations made
    while importing modules. Register at module level, beside the type's
    definition, so that every process that can unpickle the type has its rule.
    """
    if fn is None:

        def decorate(f: _Fn) -> _Fn:
            register_collate(types, f)
            return f

        return decorate
    if not callable(fn):
        raise TypeError(f"register_collate: fn must be callable, got {_type_name(fn)}")
    for cls in types if isinstance(types, tuple) else (types,):
        if not isinstance(cls, type):
            raise TypeError(f"register_collate: expected a type or a tuple of types, got {cls!r}")
        _REGISTRY[cls] = fn
    return None


def unregister_collate(types: type | tuple[type, ...]) -> None:
    """Remove registrations made with :func:`register_collate`; unknown types are ignored."""
    for cls in types if isinstance(types, tuple) else (types,):
        _REGISTRY.pop(cls, None)


def _registered_fn(cls: type) -> CollateFn | None:
    for base in cls.__mro__:
        fn = _REGISTRY.get(base)
        if fn is not None:
            return fn
    return None


def _mapped_fn(fn_map: CollateFnMap, elem: Any) -> CollateFn | None:
    """torch's lookup in a ``collate_fn_map``: exact type, then isinstance in order."""
    fn = fn_map.get(type(elem))
    if fn is not None:
        return fn
    for key, fn in fn_map.items():
        if isinstance(elem, key):
            return fn
    return None
