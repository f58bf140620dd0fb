"""Argument checks the samplers share: torch's messages for a bad integer or boolean
(``is_int`` also for the loader's arguments and the epochs datasets report), and
the length ``len()`` can return."""

from __future__ import annotations

import numbers
import sys
from typing import Any, TypeGuard


def _is_int(value: object) -> TypeGuard[numbers.Integral]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (numpy's too) and not a bool, for a caller
    that keeps the value as it is (``_is_int`` narrows it to ``numbers.Integral``)."""
    return _is_int(value)


def _check_positive_int(name: str, value: Any, context: str = "") -> int:
    """``value`` as an int, or torch's ValueError for a non-positive or non-integer value."""
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value}{context}")
    return int(value)


def _check_bool(name: str, value: Any, error: type[Exception] = ValueError) -> bool:
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value}")
    return value


def _check_int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r} ({type(value).__name__})")
    return int(value)


def checked_length(kind: str, length: int, attribute: str = "num_samples") -> int:
    """``length`` for ``__len__``, or an OverflowError that says where the
    count is (``attribute``): Python's ``len()`` stops at ``sys.maxsize``."""
    if length > sys.maxsize:
        raise OverflowError(
            f"{kind} has {length} items, more than len() can return ({sys.maxsize}); "
            f"read the count from its {attribute} attribute instead"
        )
    return length
