"""The context of one collation: what stays fixed while the recursion walks a batch.

:class:`_Context` carries the name used in messages (``default_collate``,
``collate``, ``PadCollate``), the ``allocate`` hook, the user's
``collate_fn_map`` and the padding. It sits below every other module of the
package, so each can name it; the padding is typed by what the collation reads
of it (:class:`_Padding`), which :class:`~conveyor.collate.PadCollate`
provides.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Protocol

from .allocation import Allocator, allocate_batch


class _Padding(Protocol):
    """What the collation reads of a ``PadCollate`` (``padding.py``)."""

    @property
    def keys(self) -> collections.abc.Collection | None: ...

    @property
    def pad_value(self) -> Any: ...

    @property
    def side(self) -> str: ...

    @property
    def return_lengths(self) -> bool: ...

    @property
    def return_mask(self) -> bool: ...

    def _result(self, values: Any, lengths: Any, mask: Any) -> Any: ...

    def _padded_length(self, longest: int) -> int: ...


class _Context:
    """What stays fixed during one collation: rules, allocator, padding.

    ``fn_map`` is a ``collate_fn_map`` (``registry.CollateFnMap``: type or
    tuple of types -> function); ``pad_keys_seen`` collects the keys named in
    ``PadCollate(keys=...)`` that the batch held.
    """

    __slots__ = ("fn_map", "allocate", "name", "padding", "pad_keys_seen")

    def __init__(
        self,
        name: str,
        allocate: Allocator = allocate_batch,
        fn_map: collections.abc.Mapping | None = None,
        padding: _Padding | None = None,
    ) -> None:
        self.name = name
        self.allocate = allocate
        self.fn_map = fn_map
        self.padding = padding
        self.pad_keys_seen: set = set()
